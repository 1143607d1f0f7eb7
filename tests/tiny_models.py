"""Tiny random-weight GGUFs of the hybrid architectures (attention layers beside recurrent
ones), written in a second or two, for the tests of what a recurrent state does to the cache.

- lfm2: LFM2's layout, short-convolution layers (a rolling state of the last l_cache - 1
  tokens) and attention layers;
- qwen35: Qwen3.5's, gated delta-net layers (a conv state and a matrix state per head) with a
  full-attention layer every fourth;
- granitehybrid: Granite 4.0-H's, Mamba-2 layers and attention layers.

Each is four layers of width 128, F32 throughout (no quantization: the point is the shape of
the state, not the speed), with SmolLM2's tokenizer and chat template (bench/make_models.py
writes them), so prompts tokenize and render as the default model's. The text they write is
noise; their KV and recurrent states are the real architectures'. The names and shapes are
llama.cpp's (vendor/llama.cpp/src/models/<arch>.cpp, src/llama-arch.cpp); the helpers list
them in numpy order (llama.cpp's dimensions reversed).

    python -m tests.tiny_models DIR   # writes the three into DIR
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.make_models import WEIGHT_STD, Tensor, write_gguf

VOCAB = 49152  # SmolLM2's tokenizer, unpadded
HIDDEN = 128
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
FFN = 256
CONTEXT = 32768
RMS_EPS = 1e-5


def _t(name: str, *llama_dims: int) -> Tensor:
    """A tensor by llama.cpp's dimensions (ne0 first), F32."""
    return (name, tuple(reversed(llama_dims)), np.float32)


def _values(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Norms 1, biases 0, a state's decay negative (A = -1: the state forgets, so long
    prompts stay finite), skips (D) 1, weights N(0, WEIGHT_STD)."""
    base = name.split(".")[-1] if name.startswith("blk.") and name.count(".") == 2 else ""
    if name.endswith("_norm.weight") or base == "ssm_d":
        return np.ones(shape, dtype=np.float32)
    if base == "ssm_a":
        return -np.ones(shape, dtype=np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * WEIGHT_STD


def _common(writer, name: str, layers: int, ffn: int = FFN, *, hidden: int = HIDDEN,
            heads: int = HEADS, title: str | None = None, file_type: int = 0) -> None:
    writer.add_name(title or f"tiny {name}, random weights (Reame tests)")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_file_type(file_type)  # 0: ALL_F32, 1: MOSTLY_F16


def _ffn(b: str) -> list[Tensor]:
    return [_t(b + "ffn_gate.weight", HIDDEN, FFN), _t(b + "ffn_up.weight", HIDDEN, FFN),
            _t(b + "ffn_down.weight", FFN, HIDDEN)]


# LFM2: "conv" layers (short convolution) and "attn" layers, as LFM2-350M mixes them.
LFM2_LAYERS = ("conv", "attn", "conv", "attn")
LFM2_L_CACHE = 3


@dataclass(frozen=True)
class LFM2Shape:
    """An LFM2 model's dimensions: the tiny one of the tests by default; bench/make_models.py
    writes LFM2-1.2B's (F16 weights, then quantized)."""
    layers: tuple[str, ...] = LFM2_LAYERS
    hidden: int = HIDDEN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    ffn: int = FFN
    vocab: int = VOCAB
    l_cache: int = LFM2_L_CACHE
    weights: type = np.float32  # the 2-D tensors' type in the file (norms stay F32)
    name: str = "tiny lfm2, random weights (Reame tests)"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def write_lfm2(path: Path, shape: LFM2Shape = LFM2Shape()) -> Path:
    layers, h, d, ffn = shape.layers, shape.hidden, shape.head_dim, shape.ffn
    kv = shape.kv_heads * d

    def metadata(writer) -> None:
        _common(writer, "lfm2", len(layers), ffn, hidden=h, heads=shape.heads,
                title=shape.name, file_type=0 if shape.weights == np.float32 else 1)
        # A layer without KV heads is a convolution layer (lfm2.cpp: is_recr).
        writer.add_head_count_kv([shape.kv_heads if kind == "attn" else 0 for kind in layers])
        writer.add_shortconv_l_cache(shape.l_cache)

    def w(name: str, *llama_dims: int) -> Tensor:  # a weight matrix, in the shape's type
        return (name, tuple(reversed(llama_dims)), shape.weights)

    tensors = [w("token_embd.weight", h, shape.vocab), _t("token_embd_norm.weight", h)]
    for i, kind in enumerate(layers):
        b = f"blk.{i}."
        tensors += [_t(b + "attn_norm.weight", h), _t(b + "ffn_norm.weight", h)]
        if kind == "attn":
            tensors += [_t(b + "attn_q_norm.weight", d), _t(b + "attn_k_norm.weight", d),
                        w(b + "attn_q.weight", h, h), w(b + "attn_k.weight", h, kv),
                        w(b + "attn_v.weight", h, kv), w(b + "attn_output.weight", h, h)]
        else:
            # The convolution's own weights stay F32 (llama.cpp's ssm_conv takes no other).
            tensors += [_t(b + "shortconv.conv.weight", shape.l_cache, h),
                        w(b + "shortconv.in_proj.weight", h, 3 * h),
                        w(b + "shortconv.out_proj.weight", h, h)]
        tensors += [w(b + "ffn_gate.weight", h, ffn), w(b + "ffn_up.weight", h, ffn),
                    w(b + "ffn_down.weight", ffn, h)]
    write_gguf(path, "lfm2", metadata, tensors, values=_values)
    return path


# Qwen3.5: gated delta-net layers with a full-attention layer every FULL_ATTENTION_INTERVAL.
QWEN35_LAYERS = 4
FULL_ATTENTION_INTERVAL = 4
SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_V_HEADS = 4, 32, 2, 4  # key heads = groups
QWEN35_ROT = 16  # partial rotary, as Qwen3.5's (a quarter of the head)


@dataclass(frozen=True)
class Qwen35Shape:
    """A Qwen3.5 model's dimensions: the tiny one of the tests by default; bench/hybrid_shapes.py
    writes Qwen3.5-0.8B's (F16 weights, then quantized)."""
    layers: int = QWEN35_LAYERS
    hidden: int = HIDDEN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    ffn: int = FFN
    vocab: int = VOCAB
    ssm_state: int = SSM_STATE  # a delta-net head's key (and value) size
    ssm_groups: int = SSM_GROUPS  # key heads
    ssm_v_heads: int = SSM_V_HEADS
    rope_sections: tuple[int, int, int, int] = (3, 3, 2, 0)  # halves of the rotary dims
    weights: type = np.float32  # the 2-D tensors' type in the file (norms, conv, decay F32)
    name: str = "tiny qwen35, random weights (Reame tests)"

    @property
    def rotary(self) -> int:
        return 2 * sum(self.rope_sections)


def write_qwen35(path: Path, shape: Qwen35Shape = Qwen35Shape()) -> Path:
    h, d, state = shape.hidden, shape.head_dim, shape.ssm_state
    inner = state * shape.ssm_v_heads  # value dim: one state-size head per value head

    def metadata(writer) -> None:
        _common(writer, "qwen35", shape.layers, shape.ffn, hidden=h, heads=shape.heads,
                title=shape.name, file_type=0 if shape.weights == np.float32 else 1)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_key_length(d)
        writer.add_value_length(d)
        writer.add_rope_dimension_count(shape.rotary)
        writer.add_rope_dimension_sections(list(shape.rope_sections))
        writer.add_ssm_conv_kernel(SSM_CONV)
        writer.add_ssm_inner_size(inner)
        writer.add_ssm_state_size(state)
        writer.add_ssm_time_step_rank(shape.ssm_v_heads)
        writer.add_ssm_group_count(shape.ssm_groups)
        writer.add_full_attention_interval(FULL_ATTENTION_INTERVAL)

    def w(name: str, *llama_dims: int) -> Tensor:  # a weight matrix, in the shape's type
        return (name, tuple(reversed(llama_dims)), shape.weights)

    key_dim = state * shape.ssm_groups
    conv_dim = 2 * key_dim + inner
    kv = shape.kv_heads * d
    v_heads = shape.ssm_v_heads
    tensors = [w("token_embd.weight", h, shape.vocab), _t("output_norm.weight", h)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        tensors += [_t(b + "attn_norm.weight", h), _t(b + "post_attention_norm.weight", h)]
        if (i + 1) % FULL_ATTENTION_INTERVAL:  # linear attention (qwen35.cpp: is_recr)
            tensors += [w(b + "attn_qkv.weight", h, conv_dim), w(b + "attn_gate.weight", h, inner),
                        _t(b + "ssm_conv1d.weight", SSM_CONV, conv_dim),
                        _t(b + "ssm_dt.bias", v_heads), _t(b + "ssm_a", v_heads),
                        w(b + "ssm_beta.weight", h, v_heads),
                        w(b + "ssm_alpha.weight", h, v_heads),
                        _t(b + "ssm_norm.weight", state), w(b + "ssm_out.weight", inner, h)]
        else:  # full attention: a query and its gate from one projection
            tensors += [w(b + "attn_q.weight", h, 2 * shape.heads * d),
                        w(b + "attn_k.weight", h, kv), w(b + "attn_v.weight", h, kv),
                        w(b + "attn_output.weight", shape.heads * d, h),
                        _t(b + "attn_q_norm.weight", d), _t(b + "attn_k_norm.weight", d)]
        tensors += [w(b + "ffn_gate.weight", h, shape.ffn), w(b + "ffn_up.weight", h, shape.ffn),
                    w(b + "ffn_down.weight", shape.ffn, h)]
    write_gguf(path, "qwen35", metadata, tensors, values=_values)
    return path


# Granite 4.0-H: Mamba-2 layers ("ssm") and attention layers.
GRANITE_LAYERS = ("ssm", "attn", "ssm", "attn")
MAMBA_CONV, MAMBA_STATE, MAMBA_GROUPS, MAMBA_HEAD = 4, 16, 1, 32


def write_granitehybrid(path: Path) -> Path:
    layers = GRANITE_LAYERS
    inner = 2 * HIDDEN  # llama.cpp supports an expansion factor of 2 only
    heads = inner // MAMBA_HEAD

    def metadata(writer) -> None:
        _common(writer, "granitehybrid", len(layers))
        # A layer without KV heads is a Mamba-2 layer (granite-hybrid.cpp: is_recr).
        writer.add_head_count_kv([KV_HEADS if kind == "attn" else 0 for kind in layers])
        writer.add_ssm_conv_kernel(MAMBA_CONV)
        writer.add_ssm_inner_size(inner)
        writer.add_ssm_state_size(MAMBA_STATE)
        writer.add_ssm_time_step_rank(heads)
        writer.add_ssm_group_count(MAMBA_GROUPS)
        for add in (writer.add_embedding_scale, writer.add_residual_scale,
                    writer.add_logit_scale):
            add(1.0)
        writer.add_attention_scale(HEAD_DIM ** -0.5)

    conv_dim = inner + 2 * MAMBA_GROUPS * MAMBA_STATE
    kv = KV_HEADS * HEAD_DIM
    tensors = [_t("token_embd.weight", HIDDEN, VOCAB), _t("output_norm.weight", HIDDEN)]
    for i, kind in enumerate(layers):
        b = f"blk.{i}."
        tensors += [_t(b + "attn_norm.weight", HIDDEN), _t(b + "ffn_norm.weight", HIDDEN)]
        if kind == "ssm":
            tensors += [_t(b + "ssm_in.weight", HIDDEN, 2 * inner + 2 * MAMBA_GROUPS * MAMBA_STATE
                           + heads),
                        _t(b + "ssm_conv1d.weight", MAMBA_CONV, conv_dim),
                        _t(b + "ssm_conv1d.bias", conv_dim),
                        _t(b + "ssm_dt.bias", heads), _t(b + "ssm_a", 1, heads),
                        _t(b + "ssm_d", 1, heads),
                        _t(b + "ssm_norm.weight", inner // MAMBA_GROUPS, MAMBA_GROUPS),
                        _t(b + "ssm_out.weight", inner, HIDDEN)]
        else:
            tensors += [_t(b + "attn_q.weight", HIDDEN, HIDDEN), _t(b + "attn_k.weight", HIDDEN, kv),
                        _t(b + "attn_v.weight", HIDDEN, kv),
                        _t(b + "attn_output.weight", HIDDEN, HIDDEN)]
        tensors += _ffn(b)
    write_gguf(path, "granitehybrid", metadata, tensors, values=_values)
    return path


FAMILIES: dict[str, Callable[[Path], Path]] = {
    "lfm2": write_lfm2, "qwen35": write_qwen35, "granitehybrid": write_granitehybrid}


def write(family: str, folder: Path) -> Path:
    """The tiny model of family written into folder (tiny-<family>.gguf)."""
    return FAMILIES[family](Path(folder) / f"tiny-{family}.gguf")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        print(write(family, out))
