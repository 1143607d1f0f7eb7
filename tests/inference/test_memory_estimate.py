"""The Settings tab's memory estimate (catalog.memory_needed) against real servers' resident
memory: every configuration `python -m bench.memory` measured (bench/results/memory/
results.json, recomputed from the header facts recorded there, or from the file where it is
here), and one server of the default model started here and now."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from reame.models.catalog import memory_needed
from reame.models.gguf_info import GGUFInfo, read_gguf_info
from reame.models.repack import plan_weights

from tests.conftest import ENGINE_PROCESS, ROOT, start_server

RESULTS = ROOT / "bench" / "results" / "memory" / "results.json"
MODEL_FOLDERS = (ROOT / "models", ROOT / "bench" / "cache")
TOLERANCE = 0.15
MB = 2**20

MEASURED = json.loads(RESULTS.read_text(encoding="utf-8"))


def header_facts(info: GGUFInfo) -> dict:
    facts = dataclasses.asdict(info)
    del facts["path"]
    return json.loads(json.dumps(facts))  # as results.json holds them (lists, not tuples)


def row_id(row: dict) -> str:
    return f"{row['model']}-{row['n_ctx']}-{row['kv_type']}"


def test_the_results_cover_every_configuration():
    rows = MEASURED["rows"]
    assert {(r["model"], r["n_ctx"], r["kv_type"]) for r in rows} == {
        (m, n, k) for m in ("smollm2", "qwen2.5-0.5b", "qwen2.5-1.5b") for n in (4096, 8192)
        for k in ("f16", "q8_0")}
    for r in rows:
        assert 1 <= r["slots"] <= r["slots_wanted"]
        assert r["prompt_tokens"] >= r["n_ctx"] // 2 - 64  # the prompt filled half the window
        assert r["peak_rss"] >= r["idle"]["rss"] > r["header"]["size"]


@pytest.mark.parametrize("row", MEASURED["rows"], ids=row_id)
def test_the_estimate_is_near_each_measured_server(row):
    info = GGUFInfo(path=Path(row["file"]), **row["header"])
    for folder in MODEL_FOLDERS:
        if (folder / row["file"]).exists():  # the file here is the one measured
            info = read_gguf_info(folder / row["file"])
            facts = header_facts(info)  # of those recorded (a newer field: its default)
            assert {k: facts[k] for k in row["header"]} == row["header"], (
                f"{folder / row['file']} is not the file measured: run python -m bench.memory")
    # The weights as that server held them: its [model] mmap, on the CPU that measured it.
    weights = plan_weights(info, row["mmap"], MEASURED["machine"]["cpu_features"])
    needed = memory_needed(info, row["n_ctx"], row["kv_type"], row["slots"], weights=weights)
    peak = row["peak_rss"]
    assert abs(needed - peak) <= TOLERANCE * peak, (needed / MB, peak / MB)


# the KV llama.cpp allocates, against GGUFInfo.kv_bytes_per_slot


def allocated_kv(path: Path, **engine_args) -> tuple[int, bool]:
    """The bytes of the KV buffers llama.cpp reports allocating for an engine (its log lines
    "... KV buffer size = X MiB"), and whether it kept the window layers full-size."""
    import ctypes

    import llama_cpp
    from llama_cpp._logger import llama_log_callback

    from reame.inference.engine import Engine

    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        lines.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        engine = Engine(path, n_threads=1, **engine_args)
        swa_full = engine.swa_full
        engine.close()
    finally:
        llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
    mib = re.findall(r"KV buffer size\s*=\s*([\d.]+) MiB", "".join(lines))
    assert mib, "no KV buffer size in llama.cpp's log"
    return round(sum(float(m) for m in mib) * MB), swa_full


@pytest.mark.parametrize("n_ctx, slots, swa_full", [
    (4096, 1, None),  # as the engine loads it: 27 MiB, not 72
    (4096, 1, True),  # llama.cpp's default: every layer at n_ctx
    (2048, 2, None),  # two slots, each its own window cells
    (768, 1, None),  # a context under the window and a decode: every layer at n_ctx
])
def test_the_kv_estimate_is_what_llama_cpp_allocates_for_gemma3(gemma_path, n_ctx, slots,
                                                                 swa_full):
    info = read_gguf_info(gemma_path)
    assert info.window_layers == 15 and info.layers == 18  # 5 of every 6 layers
    real, kept_full = allocated_kv(gemma_path, n_ctx=n_ctx, slots=slots, swa_full=swa_full)
    assert kept_full is bool(swa_full)  # a sliding window's layers: not full-size by default
    estimate = slots * info.kv_bytes_per_slot(n_ctx, "f16", swa_full=kept_full)
    assert abs(estimate - real) <= 0.02 * real, (estimate / MB, real / MB)


def test_the_kv_estimate_is_what_llama_cpp_allocates_for_a_dense_model(model_path):
    real, kept_full = allocated_kv(model_path, n_ctx=2048)
    assert kept_full  # no window: llama.cpp's default, which changes nothing
    estimate = read_gguf_info(model_path).kv_bytes_per_slot(2048, "f16")
    assert abs(estimate - real) <= 0.02 * real, (estimate / MB, real / MB)


# live: a server of the default model on this machine


class PeakRSS:
    """A server's peak resident memory, its processes summed: sampled every 50 ms, and the
    kernel's high-water marks (VmHWM, reset at the start) where /proc allows it."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = self._rss()
        for process in self._processes():
            try:
                Path(f"/proc/{process.pid}/clear_refs").write_text("5")
            except OSError:
                pass
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _processes(self) -> list[psutil.Process]:
        """The server's process and its children (the engine's, with [model]
        engine_process)."""
        return [self.process, *self.process.children(recursive=True)]

    def _rss(self) -> int:
        total = 0
        for process in self._processes():
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        hwm = 0
        for process in self._processes():  # each process's own high-water mark, summed
            try:
                status = Path(f"/proc/{process.pid}/status").read_text()
                hwm += int(re.search(r"VmHWM:\s+(\d+)\s+kB", status).group(1)) * 1024
            except (OSError, AttributeError):
                pass
        return max(self.peak, hwm)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, b""


@pytest.mark.slow
def test_a_live_server_of_the_default_model_stays_near_its_estimate(tmp_path, model_path):
    n_ctx = 2048
    server = start_server(tmp_path / "server", model_path=model_path, n_ctx=n_ctx,
                          max_tokens=16)
    try:
        deadline = time.monotonic() + 60
        while get(server.url + "health")[0] != 200:
            assert time.monotonic() < deadline, "GET /health did not answer 200"
            time.sleep(0.2)
        model = json.loads(get(server.url + "v1/models")[1])["data"][0]["id"]
        peak = PeakRSS(server.process.pid)
        body = {"model": model, "max_tokens": 16, "temperature": 0,
                "messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "The sea is wide and deep. " * 140
                              + "Say something about the sea."}]}
        request = urllib.request.Request(server.url + "v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as answer:
            usage = json.loads(answer.read())["usage"]
        time.sleep(2)  # the KV is copied out of llama.cpp for its file after the reply
        measured = peak.stop()
        loaded = re.findall(r"loaded \S+ \(n_ctx \d+, (\d+) slots?",
                            server.log_path.read_text(errors="replace"))
    finally:
        server.stop()
    assert usage["prompt_tokens"] > n_ctx // 3  # a long-ish prompt
    slots = int(loaded[-1])
    needed = memory_needed(read_gguf_info(model_path), n_ctx, "f16", slots,
                           engine_process=ENGINE_PROCESS)
    assert abs(needed - measured) <= TOLERANCE * measured, (needed / MB, measured / MB)
