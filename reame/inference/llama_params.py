"""The parameters llama.cpp loads a model and makes a context with, and its one-time set-up."""

from __future__ import annotations

import llama_cpp
from llama_cpp._logger import set_verbose

from reame.models.repack import Weights

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}


def model_params(weights: Weights) -> llama_cpp.llama_model_params:
    """llama.cpp's defaults, the file mapped or read as weights says (repack.plan_weights).
    Mapped is llama.cpp's AUTO: mapped unless a device cannot map."""
    params = llama_cpp.llama_model_default_params()
    params.load_mode = (llama_cpp.LLAMA_LOAD_MODE_AUTO if weights.mapped
                        else llama_cpp.LLAMA_LOAD_MODE_NONE)
    return params


def context_params(n_ctx: int, slots: int, n_batch: int, threads: int, kv_type: str,
                   flash_attn: bool, swa_full: bool = True) -> llama_cpp.llama_context_params:
    """A context of `slots` sequences of n_ctx tokens each, in cells of their own; a sliding
    window's layers in n_ctx cells too (swa_full), or in the window and a decode's."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = n_ctx * slots, slots, False
    params.swa_full = swa_full
    params.n_batch = params.n_ubatch = n_batch
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    params.type_k = params.type_v = KV_TYPES[kv_type]
    return params


def swa_full_for(n_swa: int, recurrent: bool) -> bool:
    """Whether a model whose window layers see the last n_swa positions (0: none) keeps those
    layers' KV in n_ctx cells (llama.cpp's default), not in the window and a decode's; a
    recurrent or hybrid model (recurrent) keeps llama.cpp's default.

    Not on a sliding window: what a full-size window cache would add is positions no decode
    sees again, and the engine never uses them (a window memory past its window is not cut
    back, kv_memory.py; a mark keeps the window layers' state). Measured on 2026-12-07 at
    commit 278d160 (python -m bench.families --swa-full both, bench/results/families/
    2026-12-07-278d160-dirty): Gemma 3 270M at n_ctx 4,096 takes 27.0 MiB of KV a slot
    without, 72.0 MiB with; its chats' files (9.68 MB at ~250 tokens, 27.56 MB at ~1,400),
    the tokens reused after a restart (223 of 229, 1,371 of 1,377) and a reply's speed at
    ~1,000 tokens of context (42.7 ms a token without, 41.9 with: within the runs' spread)
    are the same.
    """
    return n_swa <= 0 or recurrent


# Attention heads at least this wide get flash attention by default ([model] flash_attn =
# auto). Measured here (Xeon, AVX-512, 2 threads; python -m bench.flash_attention): with
# 128-wide heads (the Qwen2.5-1.5B shape) flash attention is 2-9 % faster at everything (a
# prompt, a reply at 100 and 800 tokens of context, 4 replies at once); with 64-wide heads
# (SmolLM2, the Qwen2.5-0.5B shape) a reply at 800 tokens of context is 28-46 % slower with it
# and 4 replies at once 8-16 % slower.
FLASH_HEAD_DIM = 128


def flash_attention(mode: str, kv_type: str, head_dim: int | None) -> tuple[bool, str]:
    """Whether a context uses flash attention, and why ([model] flash_attn)."""
    if kv_type != "f16":
        return True, f"the {kv_type} KV cache needs it"
    if mode in ("true", "false"):
        return mode == "true", f"[model] flash_attn = {mode}"
    if head_dim is None:
        return False, "the model's head size is unknown"
    on = head_dim >= FLASH_HEAD_DIM
    return on, (f"attention heads {head_dim} wide ({'at least' if on else 'under'} "
                f"{FLASH_HEAD_DIM})")


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
    set_verbose(False)  # llama.cpp's own log: errors only (as Llama(verbose=False))
