"""Which of a model's weights llama.cpp repacks on this CPU, and so whether to map the model
file or read it into memory.

At load, llama.cpp's CPU backend copies the matrices its fastest kernels multiply into an
interleaved layout, in an extra buffer (CPU_REPACK; AMX where it is built with it). With the
file mapped (llama.cpp's default), the pages of those matrices stay resident as well: held
twice. Read into memory instead (LLAMA_LOAD_MODE_NONE), a repacked matrix is held once, in its
repacked layout, and the rest is read into the process's own memory rather than mapped.

The rule mirrors ggml_repack_get_optimal_repack_type (ggml/src/ggml-cpu/repack.cpp) and the AMX
buffer's types (ggml-cpu/amx/common.h) of the llama.cpp in llama-cpp-python 0.3.36. It reads
the CPU features llama.cpp reports (llama_print_system_info): the same compile-time and run-time
checks its choice makes. RISC-V's and KleidiAI's buffers are not modelled (KleidiAI takes
Q4_0 / Q8_0 on ARM, which CPU_REPACK takes otherwise). tests/inference/test_load_mode.py checks the rule
against llama.cpp's own load log on the machine it runs on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llama_cpp

from reame.models.gguf_info import GGUFInfo

# ggml types
Q4_0, Q4_1, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K = 2, 3, 8, 10, 12, 13, 14
IQ4_NL, IQ4_XS, MXFP4, Q1_0 = 20, 23, 39, 41

MODES = ("auto", "true", "false")  # [model] mmap


@functools.cache
def cpu_features() -> dict[str, str]:
    """The CPU backend's features as llama.cpp reports them, e.g. {"AVX2": "1", ...}."""
    text = llama_cpp.llama_print_system_info().decode(errors="replace")
    pairs = (item.split("=", 1) for item in text.split("|") if "=" in item)
    return {name.split(":")[-1].strip(): value.strip() for name, value in pairs}


def repack_rule(features: dict[str, str]) -> dict[int, int]:
    """ggml type -> the row multiple a matrix of that type needs to be repacked, on a CPU
    with these features; {} if llama.cpp repacks nothing there. Where several kernels could
    take a type, the smallest multiple: llama.cpp falls back to the next kernel."""
    has = lambda *names: all(features.get(n) == "1" for n in names)  # noqa: E731
    rule: dict[int, int] = {}

    def take(kinds: tuple[int, ...], multiple: int) -> None:
        for kind in kinds:
            rule[kind] = min(rule.get(kind, multiple), multiple)

    if has("REPACK"):
        if has("AVX2"):
            take((Q4_0, Q4_K, IQ4_NL, MXFP4), 8)
        if has("AVX512"):
            take((Q2_K,), 8)
        if has("SVE", "MATMUL_INT8") and features.get("SVE_CNT") == "32":
            take((Q4_0,), 8)
        if has("NEON", "MATMUL_INT8") or has("NEON", "DOTPROD"):
            take((Q4_0, Q8_0, Q1_0), 4)
            take((Q4_K, Q5_K, Q6_K), 8)
        if has("NEON", "DOTPROD"):
            take((IQ4_NL, MXFP4), 4)
        if has("VXE"):  # s390x
            take((Q4_0,), 4)
    if has("AMX_INT8", "AVX512_VNNI"):  # the AMX buffer, asked before CPU_REPACK
        take((Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), 32)
    return rule


def cpu_repacks() -> bool:
    """Whether the installed llama.cpp repacks any weights on this CPU."""
    return bool(repack_rule(cpu_features()))


def _taken(matrix: tuple[int, int, int], rule: dict[int, int]) -> int:
    kind, multiple, size = matrix
    return size if kind in rule and multiple % rule[kind] == 0 else 0


@dataclass(frozen=True)
class Weights:
    """How a model's weights sit in memory: mapped from the file or read into memory, and the
    bytes llama.cpp repacks."""

    mapped: bool
    repacked: int  # bytes of the file's matrices held repacked
    copied: int  # bytes of a repacked copy of a matrix also held as is (a tied output)
    reason: str

    def resident(self, file_size: int) -> int:
        """The weights' resident bytes: the file, and the repacked matrices a second time
        where the file is mapped; a tied output's repacked copy either way."""
        return file_size + self.copied + (self.repacked if self.mapped else 0)


def plan_weights(info: GGUFInfo, mmap: str = "auto",
                 features: dict[str, str] | None = None) -> Weights:
    """How to load info's model ([model] mmap): "auto" reads it into memory where llama.cpp
    repacks some of the file's matrices on this CPU (features: llama.cpp's, default this
    one's), and maps it otherwise: cheaper to start, its pages shared with the page cache and
    other processes, and dropped and read again under memory pressure rather than swapped."""
    if mmap not in MODES:
        raise ValueError(f"mmap {mmap!r}: expected one of {', '.join(MODES)}")
    rule = repack_rule(cpu_features() if features is None else features)
    repacked = sum(_taken(m, rule) for m in info.matrices)
    copied = _taken(info.tied_output, rule) if info.tied_output else 0
    mb = f"{repacked / 2**20:,.0f} MB of its {info.size / 2**20:,.0f} MB"
    if mmap != "auto":
        mapped = mmap == "true"
        why = f"[model] mmap = {mmap}; llama.cpp repacks {mb}"
    elif repacked:
        mapped = False
        why = f"llama.cpp repacks {mb} on this CPU: a mapped file would hold them twice"
    else:
        mapped = True
        why = "llama.cpp repacks none of its weights on this CPU"
    return Weights(mapped, repacked, copied, why)
