"""Random-weight GGUFs with the real shapes of hybrid models (attention beside recurrent
layers), for the benchmark's timings: what bench/make_models.py does for dense shapes.

    python -m bench.hybrid_shapes            # every shape into bench/cache/ (gitignored)

LFM2-1.2B (LiquidAI/LFM2-1.2B's config: 16 layers, 10 short-convolution and 6 attention at
2, 5, 8, 10, 12 and 14; hidden 2,048; 32 heads, 8 KV heads; FFN 8,192 after its auto-adjust;
vocabulary 65,536; a convolution cache of 3) and Qwen3.5-0.8B (Qwen/Qwen3.5-0.8B's text model:
24 layers, 6 x (3 gated delta-net + 1 gated attention); hidden 1,024; attention 8 heads, 2 KV
heads of 256, a quarter of each rotated; delta-net 16 key and 16 value heads of 128, a
convolution of 4; FFN 3,584; vocabulary 248,320; embeddings tied), written with
tests/tiny_models.py's writers at these dimensions as F16, quantized to Q4_K_M with llama.cpp's
quantizer, the F16 deleted. The tokenizer is SmolLM2's padded to the vocabulary's size. Its
text is noise; its prefill speed, KV and recurrent state are the real shape's. A JSON file
beside it describes it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from bench.make_models import CACHE, write_quantized
from tests.tiny_models import LFM2Shape, Qwen35Shape, write_lfm2, write_qwen35

log = logging.getLogger("bench.hybrid_shapes")

LFM2_1_2B = LFM2Shape(
    layers=tuple("attn" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)),
    hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=65536, weights=np.float16,
    name="LFM2-1.2B shape, random weights (Reame benchmark)")
QWEN35_0_8B = Qwen35Shape(
    layers=24, hidden=1024, heads=8, kv_heads=2, head_dim=256, ffn=3584, vocab=248320,
    ssm_state=128, ssm_groups=16, ssm_v_heads=16, rope_sections=(11, 11, 10, 0),
    weights=np.float16, name="Qwen3.5-0.8B shape, random weights (Reame benchmark)")
SHAPES = {"lfm2-1.2b": LFM2_1_2B, "qwen3.5-0.8b": QWEN35_0_8B}
WRITERS = {"lfm2-1.2b": write_lfm2, "qwen3.5-0.8b": write_qwen35}


def _describe(name: str, shape) -> str:
    if isinstance(shape, Qwen35Shape):
        attention = [i for i in range(shape.layers) if (i + 1) % 4 == 0]
        return (f"{shape.layers} layers, gated attention at {attention} ({shape.heads} heads, "
                f"{shape.kv_heads} KV heads of {shape.head_dim}), the others gated delta-nets "
                f"({shape.ssm_groups} key and {shape.ssm_v_heads} value heads of "
                f"{shape.ssm_state}); hidden {shape.hidden}, FFN {shape.ffn}")
    attention = [i for i, kind in enumerate(shape.layers) if kind == "attn"]
    return (f"{len(shape.layers)} layers, attention at {attention}, the others short "
            f"convolutions; hidden {shape.hidden}, {shape.heads} heads, {shape.kv_heads} KV "
            f"heads, FFN {shape.ffn}")


def output_path(name: str) -> Path:
    return CACHE / f"{name}-shape-random.Q4_K_M.gguf"


def make(name: str, *, force: bool = False) -> Path:
    """Write, quantize and describe one shape; skip it when it is already there."""
    shape, out = SHAPES[name], output_path(name)
    if out.exists() and out.with_suffix(".json").exists() and not force:
        return out
    started = time.perf_counter()
    write_quantized(name, out, lambda f16: WRITERS[name](f16, shape))
    out.with_suffix(".json").write_text(json.dumps({
        "description": (f"Random weights with the shape of {name} ({_describe(name, shape)}, "
                        f"vocabulary {shape.vocab:,}; SmolLM2's tokenizer padded), "
                        "Q4_K_M: its timings and state sizes are real, its text is not."),
        "bytes": out.stat().st_size}, indent=1))
    log.info("%s: %s (%.0f MB) in %.0f s", name, out, out.stat().st_size / 2**20,
             time.perf_counter() - started)
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for shape_name in sys.argv[1:] or SHAPES:
        print(make(shape_name))
