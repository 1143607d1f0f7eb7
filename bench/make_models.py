"""Random-weight GGUFs with the real shapes of larger models, for the benchmark's timings.

    python -m bench.make_models            # both shapes into bench/cache/ (gitignored)
    python -m bench.make_models --only qwen2.5-0.5b

Each model is written as F16 with the `gguf` package (tensor by tensor, so memory stays
low), quantized to Q4_K_M with `llama_cpp.llama_model_quantize`, and the F16 file deleted.
The tokenizer (and chat template) is SmolLM2's, padded with unused tokens to the real
vocabulary size, so prompts tokenize and the output layer has its real size. The text such a
model writes is noise; its prefill speed and KV size are those of the real shape.
A JSON file beside each model describes it (the benchmark reads it).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("bench.make_models")

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "cache"
TOKENIZER_SOURCE = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class Shape:
    """The published shape of a model (Qwen2 architecture: q/k/v biases, tied embeddings)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int = 151936
    context: int = 32768
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_bytes_per_token_f16(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) in file order; numpy shape is (rows = outputs, columns = inputs)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out = [("token_embd.weight", (self.vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out += [(b + "attn_norm.weight", (h,)),
                    (b + "attn_q.weight", (h, h)), (b + "attn_q.bias", (h,)),
                    (b + "attn_k.weight", (kv, h)), (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.weight", (kv, h)), (b + "attn_v.bias", (kv,)),
                    (b + "attn_output.weight", (h, h)),
                    (b + "ffn_norm.weight", (h,)),
                    (b + "ffn_gate.weight", (self.ffn, h)), (b + "ffn_up.weight", (self.ffn, h)),
                    (b + "ffn_down.weight", (h, self.ffn))]
        out.append(("output_norm.weight", (h,)))
        return out

    def parameters(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.tensors())


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, ffn=4864),
    "qwen2.5-1.5b": Shape("qwen2.5-1.5b", layers=28, hidden=1536, heads=12, kv_heads=2, ffn=8960),
}


def output_path(shape: Shape) -> Path:
    return CACHE / f"{shape.name}-shape-random.Q4_K_M.gguf"


@functools.lru_cache(maxsize=4)
def tokenizer_fields(source: Path, vocab: int) -> dict:
    """SmolLM2's tokenizer metadata, its token list padded with unused tokens to vocab (read
    once per source and size: parsing the tokenizer's arrays takes seconds)."""
    from gguf import GGUFReader, TokenType

    reader = GGUFReader(source)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    if len(tokens) > vocab:
        raise ValueError(f"the source tokenizer has {len(tokens)} tokens, more than {vocab}")
    pad = vocab - len(tokens)
    tokens += [f"<|reame_unused_{i}|>" for i in range(pad)]
    types += [int(TokenType.UNUSED)] * pad
    return {
        "model": field("tokenizer.ggml.model"), "pre": field("tokenizer.ggml.pre"),
        "tokens": tokens, "types": types, "merges": list(field("tokenizer.ggml.merges")),
        "bos": int(field("tokenizer.ggml.bos_token_id")),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
        "unk": int(field("tokenizer.ggml.unknown_token_id")),
        "pad": int(field("tokenizer.ggml.padding_token_id")),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token")),
        "chat_template": field("tokenizer.chat_template"),
    }


def add_tokenizer(writer, vocab: int) -> None:
    """SmolLM2's tokenizer and chat template (tokenizer_fields), padded to vocab, into a
    GGUFWriter's metadata: prompts of any model written with it tokenize and render."""
    tok = tokenizer_fields(TOKENIZER_SOURCE, vocab)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model(tok["model"])
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    writer.add_unk_token_id(tok["unk"])
    writer.add_pad_token_id(tok["pad"])
    writer.add_add_bos_token(tok["add_bos"])
    writer.add_chat_template(tok["chat_template"])


def random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Norms 1, biases 0, weights N(0, WEIGHT_STD): finite activations, no meaning."""
    if name.endswith("_norm.weight"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=np.float32)
    out = np.empty(shape, dtype=np.float16)
    rows = max(1, (1 << 24) // shape[-1])  # about 16M values at a time
    for start in range(0, shape[0], rows):
        block = rng.standard_normal((min(rows, shape[0] - start),) + shape[1:], dtype=np.float32)
        out[start:start + len(block)] = block * WEIGHT_STD
    return out


# A tensor to write: its name, its numpy shape (rows = outputs, columns = inputs: llama.cpp's
# dimensions reversed) and its type in the file.
Tensor = tuple[str, tuple[int, ...], np.dtype]


def write_gguf(path: Path, arch: str, metadata: Callable[[object], None],
               tensors: list[Tensor], *, seed: int = 0,
               values: Callable[[np.random.Generator, str, tuple[int, ...]], np.ndarray]
               = random_tensor) -> None:
    """A GGUF of arch: metadata(writer) adds the architecture's keys (the tokenizer's are
    added here), then each tensor is written with values(rng, name, shape) cast to its type,
    one at a time (memory stays low)."""
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    metadata(writer)
    vocab = next(shape[0] for name, shape, _ in tensors if name == "token_embd.weight")
    add_tokenizer(writer, vocab)
    for name, dims, dtype in tensors:
        dtype = np.dtype(dtype)
        writer.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for n, (name, dims, dtype) in enumerate(tensors):
        writer.write_tensor_data(np.ascontiguousarray(values(rng, name, dims), dtype=dtype))
        if n % 50 == 0:
            log.info("%s: tensor %d/%d", path.name, n + 1, len(tensors))
    writer.close()


def write_f16(shape: Shape, path: Path, seed: int = 0) -> None:
    """The model as an F16 GGUF (1-D tensors F32), written one tensor at a time."""
    import gguf

    def metadata(writer) -> None:
        writer.add_name(f"{shape.name} shape, random weights (Reame benchmark)")
        writer.add_context_length(shape.context)
        writer.add_embedding_length(shape.hidden)
        writer.add_block_count(shape.layers)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_rope_freq_base(shape.rope_base)
        writer.add_layer_norm_rms_eps(shape.rms_eps)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tensors = [(name, dims, np.float32 if len(dims) == 1 else np.float16)
               for name, dims in shape.tensors()]
    write_gguf(path, "qwen2", metadata, tensors, seed=seed)


def quantize(src: Path, dst: Path) -> None:
    """Q4_K_M with llama.cpp's own quantizer."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = os.cpu_count() or 1
    status = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                            ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize failed with status {status}")


def write_quantized(name: str, out: Path, write: Callable[[Path], None]) -> None:
    """write(path) an F16 GGUF beside out, quantize it to Q4_K_M into out, the F16 deleted
    (out appears only once whole)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    f16 = out.with_name(out.name + ".f16.tmp")
    part = out.with_name(out.name + ".part")
    try:
        started = time.perf_counter()
        log.info("%s: writing F16 to %s", name, f16)
        write(f16)
        log.info("%s: F16 written (%.0f MB) in %.0f s; quantizing to Q4_K_M", name,
                 f16.stat().st_size / 2**20, time.perf_counter() - started)
        quantize(f16, part)
        os.replace(part, out)
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)


def make(shape: Shape, *, force: bool = False) -> Path:
    """Write, quantize and describe one shape; skip it when it is already there."""
    out = output_path(shape)
    if out.exists() and out.with_suffix(".json").exists() and not force:
        log.info("%s: already there (%s)", shape.name, out)
        return out
    started = time.perf_counter()
    log.info("%s: %.2f B parameters", shape.name, shape.parameters() / 1e9)
    write_quantized(shape.name, out, lambda f16: write_f16(shape, f16))
    description = (f"Random weights with the shape of {shape.name.replace('qwen', 'Qwen')} "
                   f"({shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, "
                   f"{shape.kv_heads} KV heads, FFN {shape.ffn}, vocabulary {shape.vocab:,}; "
                   f"SmolLM2's tokenizer padded with unused tokens), Q4_K_M: its timings and KV "
                   f"sizes are real, its text is not.")
    out.with_suffix(".json").write_text(json.dumps(
        {"description": description, "shape": asdict(shape),
         "parameters": shape.parameters(), "bytes": out.stat().st_size}, indent=1))
    log.info("%s: %s (%.0f MB) in %.0f s", shape.name, out, out.stat().st_size / 2**20,
             time.perf_counter() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.make_models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SHAPES), action="append",
                        help="make only this shape (repeatable)")
    parser.add_argument("--force", action="store_true", help="remake even if present")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not TOKENIZER_SOURCE.exists():
        log.error("the tokenizer source %s is missing: run `make model`", TOKENIZER_SOURCE)
        return 2
    for name in args.only or sorted(SHAPES):
        make(SHAPES[name], force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
