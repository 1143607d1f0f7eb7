"""The models a user can pick: what each is, and whether it can run here, before loading it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import psutil

from reame.config.reame_conf import setting
from reame.models.gguf_info import GGUFInfo, NotGGUF, read_gguf_info
from reame.models.kv_budget import slots_that_fit
from reame.models.model_file import ModelLoadError, gguf_files
from reame.models.repack import Weights, plan_weights

log = logging.getLogger(__name__)

# A server's resident memory beyond the model file, its repacked weights and the KV: Python,
# Gradio, FastAPI, SQLite, llama.cpp's library and vocabulary, and the compute buffers' pages
# that decodes of CHUNK tokens touch. Measured by `python -m bench.memory` (app.py at idle,
# less the rest): 194 MB with SmolLM2's 49k-token vocabulary to 222 MB with the Qwen2.5
# shapes' 152k, plus 2-10 MB while answering (bench/results/memory/results.md).
BASE_BYTES = 200 * 1024 * 1024
# With [model] engine_process, the engine's own process beside the server's: its interpreter
# and the inference layer's imports, and the server's vocabulary-only load of the model.
# Measured with SmolLM2 at n_ctx 4,096 in 4 slots after a reply: 707 MB for the two processes
# against 640 MB for one (2026-12-07, bench/engine_process_servers.py's two servers, the RSS
# of each server's processes summed).
ENGINE_PROCESS_BYTES = 64 * 1024 * 1024


class ModelCheckError(ValueError):
    """A model file that cannot be used here; the message says why."""


@dataclass(frozen=True)
class ModelChoice:
    info: GGUFInfo | None
    path: Path
    error: str | None = None  # why it cannot be described

    def as_dict(self, kv_type: str = setting("cache", "kv_type").default) -> dict:
        if self.info is None:
            return {"path": str(self.path), "error": self.error}
        i = self.info
        return {"path": str(i.path), "file": i.path.name, "size_bytes": i.size,
                "architecture": i.architecture, "name": i.name, "parameters": i.parameters,
                "quantization": i.quantization, "context_length": i.context_length,
                "chat_template": i.has_chat_template,
                "kv_bytes_per_token": i.kv_bytes_per_token(kv_type)}


def _inside(folder: Path, parent: Path) -> bool:
    return Path(os.path.realpath(folder)).is_relative_to(os.path.realpath(parent))


def model_folders(models_dir: Path, current: Path | None = None) -> list[Path]:
    """Where the picker looks: models_dir, and the current model's folder when it lies outside
    it (a reame.conf elsewhere names a model elsewhere: the picker still offers it)."""
    folders = [models_dir]
    if current is not None and not _inside(current.parent, models_dir):
        folders.append(current.parent)
    return folders


def _candidates(models_dir: Path, current: Path | None) -> list[Path]:
    """The .gguf files of model_folders, each file once (symlinks too), the current model's
    own path kept so that the picker can show it as chosen."""
    found = list(gguf_files(models_dir))
    for folder in model_folders(models_dir, current)[1:]:
        # Only the folder itself: the current model may sit in a home or downloads folder.
        found += sorted(p for p in folder.glob("*.gguf") if p.is_file())
    kept: dict[str, Path] = {}
    for path in found:
        key = os.path.realpath(path)
        if key not in kept or (current is not None and path == current):
            kept[key] = path
    return list(kept.values())


def list_models(models_dir: Path, *, current: Path | None = None) -> list[ModelChoice]:
    """Every .gguf under models_dir and beside the current model, once each, described from
    its header."""
    out = []
    for path in _candidates(models_dir, current):
        try:
            out.append(ModelChoice(read_gguf_info(path), path))
        except (NotGGUF, OSError) as exc:
            out.append(ModelChoice(None, path, str(exc)))
    return out


def memory_needed(info: GGUFInfo, n_ctx: int, kv_type: str, slots: int = 1, *,
                  weights: Weights | None = None, engine_process: bool = False) -> int:
    """The resident memory (RSS) of a server running this model, answering at full context.

    The weights as loaded (weights: default as the engine loads them here, repack.py): the
    model file, read in whole at load, and the matrices llama.cpp repacks a second time where
    the file stays mapped; the slots' KV, n_ctx tokens each (a sliding window's layers the
    window's: GGUFInfo.kv_bytes_per_slot); one full window's KV copied out of llama.cpp to be
    written to its file after a reply; and the server itself (BASE_BYTES), with the engine's
    own process when it has one (ENGINE_PROCESS_BYTES).
    Checked against measured servers by tests/inference/test_memory_estimate.py (within 15 %).
    """
    per_slot = info.kv_bytes_per_slot(n_ctx, kv_type) or 0
    weights = weights or plan_weights(info)
    return (BASE_BYTES + (ENGINE_PROCESS_BYTES if engine_process else 0)
            + weights.resident(info.size) + per_slot * (slots + 1))


def _supported(path: Path) -> bool:
    """Whether the installed llama.cpp knows the file's architecture (loads the vocab only)."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return False
    llama_cpp.llama_model_free(model)
    return True


def check_model(path: Path, *, n_ctx: int, kv_type: str, freed_bytes: int = 0,
                slots: int = 1, kv_budget_bytes: int | None = None,
                mmap: str = setting("model", "mmap").default,
                engine_process: bool = setting("model", "engine_process").default) -> GGUFInfo:
    """Everything that can be checked before loading; ModelCheckError names the problem.

    freed_bytes: memory that loading will free (the model being replaced). slots and
    kv_budget_bytes: as the engine will take them (kv_budget.slots_that_fit); mmap: [model]
    mmap, how it will load the weights (repack.plan_weights).
    """
    path = Path(path)
    if not path.exists():
        raise ModelCheckError(f"{path} does not exist")
    if not path.is_file():
        raise ModelCheckError(f"{path} is not a file")
    if not os.access(path, os.R_OK):
        raise ModelCheckError(f"{path} is not readable (permissions)")
    try:
        info = read_gguf_info(path)
    except NotGGUF as exc:
        raise ModelCheckError(f"not a GGUF model file: {exc}") from None
    except OSError as exc:
        raise ModelCheckError(f"cannot read {path}: {exc.strerror}") from None
    if not _supported(path):
        raise ModelCheckError(
            f"llama.cpp cannot open {path.name}: either its architecture '{info.architecture}' "
            f"is not supported by the installed llama.cpp (llama-cpp-python "
            f"{llama_cpp.__version__}), or the file is incomplete or damaged")
    if info.context_length and n_ctx > info.context_length:
        log.info("n_ctx %d is above %s's trained context of %d", n_ctx, path.name,
                 info.context_length)
    try:
        slots = slots_that_fit(slots, n_ctx, info.kv_bytes_per_slot(n_ctx, kv_type),
                               kv_budget_bytes)
    except ModelLoadError as exc:
        raise ModelCheckError(str(exc)) from None
    weights = plan_weights(info, mmap)
    needed = memory_needed(info, n_ctx, kv_type, slots, weights=weights,
                           engine_process=engine_process)
    available = psutil.virtual_memory().available + freed_bytes
    # The server asking is running: its own part (BASE_BYTES) is in memory already.
    if needed - BASE_BYTES > available:
        raise ModelCheckError(
            f"{path.name} with a {n_ctx:,}-token context in {slots} slot"
            f"{'' if slots == 1 else 's'} needs about {needed / 2**30:.1f} GB in all (weights "
            f"{weights.resident(info.size) / 2**30:.1f} GB + KV cache + the server); "
            f"{available / 2**30:.1f} GB is available. "
            "Choose a smaller n_ctx, fewer slots, q8_0 KV, or a smaller model.")
    return info
