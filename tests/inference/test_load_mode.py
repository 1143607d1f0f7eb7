"""How the engine loads a model's weights ([model] mmap, reame/models/repack.py): read into
memory where llama.cpp repacks some of them on this CPU, so that they are held once, and mapped
where it repacks none. Real llama.cpp loads, each in a fresh process: resident memory (RSS,
read with psutil) is a whole process's."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from reame.models.gguf_info import read_gguf_info
from reame.models.repack import Q2_K, Q4_0, Q4_K, Q6_K, Q8_0, plan_weights, repack_rule

from tests.conftest import ROOT

MB = 2**20

# llama.cpp's own report of its weight buffers, the file mapped (its default).
BUFFERS = """
import sys, llama_cpp
from llama_cpp._internals import LlamaModel
LlamaModel(path_model=sys.argv[1], params=llama_cpp.llama_model_default_params(), verbose=True)
"""

LOAD = """
import json, sys, psutil
from reame.inference.engine import Engine
process = psutil.Process()
before = process.memory_info()
engine = Engine(sys.argv[1], n_ctx=256, mmap=sys.argv[2], n_threads=1)
after = process.memory_info()
print(json.dumps({"mapped": engine.weights.mapped, "grown": after.rss - before.rss,
                  "file": after.shared - before.shared, "weight_bytes": engine.weight_bytes}))
"""


@pytest.fixture(params=["default", "gemma"])
def model(request, model_path, gemma_path):
    """SmolLM2 Q4_1 (no matrix llama.cpp repacks on x86 or ARM) and Gemma 3 270M Q4_K_M (a
    few Q4_K matrices, 13 MB). (The 1.5B shape, 597 MB of Q4_K: `python -m bench.memory
    --load-modes`; it is not in the suite, which makes no 1 GB model.)"""
    return {"default": model_path, "gemma": gemma_path}[request.param]


def run(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=50, check=True)


def test_the_weights_reckoned_repacked_here_are_those_llama_cpp_repacks(model):
    """The rule of repack.py, on this CPU, against llama.cpp's load log: its extra buffers
    (CPU_REPACK, AMX) hold exactly the matrices the rule says, and a tied output's copy."""
    log = run(BUFFERS, model).stderr
    buffers = {name: float(size) * MB for name, size in
               re.findall(r"(\S+) model buffer size =\s+([\d.]+) MiB", log)}
    extra = sum(size for name, size in buffers.items() if name not in ("CPU", "CPU_Mapped"))
    weights = plan_weights(read_gguf_info(model))
    assert abs(extra - (weights.repacked + weights.copied)) <= 0.01 * MB, buffers


def test_repacked_weights_are_held_once_and_a_model_without_any_stays_mapped(model):
    info = read_gguf_info(model)
    weights = plan_weights(info)  # as the engine's default, auto, loads it here
    auto, mapped = (json.loads(run(LOAD, model, mmap).stdout.splitlines()[-1])
                    for mmap in ("auto", "true"))
    assert mapped["mapped"] and mapped["file"] >= 0.95 * info.size  # all of the file read in
    assert auto["weight_bytes"] == weights.resident(info.size)
    if weights.repacked:
        # Read into memory: the repacked matrices' pages of the file are not held besides
        # their repacked copy. The process holds the file's bytes once, in its own memory.
        assert not auto["mapped"] and auto["file"] < 0.05 * info.size
        saved = mapped["grown"] - auto["grown"]
        assert 0.8 * weights.repacked <= saved <= weights.repacked + 8 * MB, (
            saved / MB, weights.repacked / MB)
        assert auto["grown"] >= 0.95 * info.size
    else:
        # Nothing repacked: the file stays mapped, held once, its pages shareable.
        assert auto["mapped"] and auto["file"] >= 0.95 * info.size
        assert abs(mapped["grown"] - auto["grown"]) <= 8 * MB


# the rule on other CPUs: their features as llama.cpp reports them

X86_AVX2 = {"AVX": "1", "AVX2": "1", "REPACK": "1"}
X86_AVX512 = {**X86_AVX2, "AVX512": "1", "AVX512_VNNI": "1"}
ARM_DOTPROD = {"NEON": "1", "ARM_FMA": "1", "DOTPROD": "1", "REPACK": "1"}


def test_the_rule_is_llama_cpp_s_on_x86_and_arm():
    assert repack_rule({**X86_AVX2, "REPACK": "0"}) == {}  # built without CPU_REPACK
    assert repack_rule({"AVX": "1", "REPACK": "1"}) == {}  # no AVX2: no kernel
    assert Q4_K in repack_rule(X86_AVX2) and Q2_K not in repack_rule(X86_AVX2)
    assert repack_rule(X86_AVX512)[Q2_K] == 8  # Q2_K's kernel is AVX-512's
    assert Q6_K not in repack_rule(X86_AVX512) and Q8_0 not in repack_rule(X86_AVX512)
    arm = repack_rule(ARM_DOTPROD)
    assert (arm[Q4_0], arm[Q4_K], arm[Q6_K], arm[Q8_0]) == (4, 8, 8, 4)
    amx = repack_rule({**X86_AVX512, "AMX_INT8": "1"})  # llama.cpp built with AMX
    assert amx[Q6_K] == 32 and amx[Q4_K] == 8


def test_a_tied_output_s_repacked_copy_is_counted_mapped_or_read(model_path):
    """SmolLM2's output is its Q8_0 token embedding: on ARM llama.cpp multiplies by a repacked
    copy of it, mapped or not, and repacks no matrix of the file (Q4_1), which stays mapped. A
    Q4_K_M file like the 1.5B shape's is read there: its Q4_K and Q6_K matrices repack."""
    info = read_gguf_info(model_path)
    smollm2 = plan_weights(info, "auto", ARM_DOTPROD)
    assert smollm2.mapped and smollm2.repacked == 0 and smollm2.copied > 20 * MB
    read = plan_weights(info, "false", ARM_DOTPROD)
    assert read.resident(info.size) == smollm2.resident(info.size) == info.size + smollm2.copied
    q4_k_m = dataclasses.replace(info, matrices=((Q4_K, 32, 600 * MB), (Q6_K, 32, 150 * MB)),
                                 tied_output=(Q6_K, 32, 190 * MB))
    arm, x86 = plan_weights(q4_k_m, "auto", ARM_DOTPROD), plan_weights(q4_k_m, "auto", X86_AVX2)
    assert (arm.mapped, arm.repacked, arm.copied) == (False, 750 * MB, 190 * MB)
    assert (x86.mapped, x86.repacked, x86.copied) == (False, 600 * MB, 0)
    assert plan_weights(q4_k_m, "true", X86_AVX2).resident(0) == 600 * MB  # held twice
