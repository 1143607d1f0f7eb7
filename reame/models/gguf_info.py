"""What a GGUF file is, read from its header without loading the weights.

The `gguf` package's GGUFReader parses every tokenizer array into numpy objects: 6-11 s for
the 98 MB default model on this machine. The picker only needs the scalar keys and the tensor
shapes, so this reader walks the header and skips arrays by their lengths (tens of ms).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"

# GGUF metadata value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# general.file_type -> the quantization name llama.cpp gives it
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
              15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS",
              20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS",
              31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}

# ggml tensor types that llama.cpp's CPU backend copies, at load, into an interleaved layout
# for its matrix kernels (the CPU_REPACK buffer: AVX2 on x86, dotprod/i8mm on ARM), as
# (values per block, bytes per block): Q4_0, Q4_K, IQ4_NL. The mapped file stays resident too.
REPACKED_TYPES = {2: (32, 18), 12: (256, 144), 20: (32, 18)}


class NotGGUF(ValueError):
    """The file is not a readable GGUF file."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    size: int
    architecture: str
    name: str
    parameters: int
    quantization: str
    context_length: int | None
    has_chat_template: bool
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    sliding_window: int | None
    # Bytes of the matrix weights llama.cpp's CPU backend repacks at load (REPACKED_TYPES;
    # not the token embedding, which is looked up, not multiplied): held twice in memory.
    repackable_bytes: int = 0

    def kv_bytes_per_token(self, kv_type: str) -> int | None:
        """K and V for every layer, at 2 bytes (f16) or 34/32 bytes (q8_0) per value."""
        if not (self.layers and self.kv_heads and self.head_dim):
            return None
        values = 2 * self.layers * self.kv_heads * self.head_dim
        return values * 2 if kv_type == "f16" else values * 34 // 32


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise NotGGUF("the header ends early")
    return struct.unpack(fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    raw = f.read(n)
    if len(raw) != n:
        raise NotGGUF("the header ends early")
    return raw.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool):
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f) if keep else _skip_string(f)
    if kind == _ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
        else:
            for _ in range(count):
                _value(f, item, False)
        return None
    raise NotGGUF(f"unknown metadata type {kind}")


def _skip_string(f: BinaryIO) -> None:
    f.seek(_read(f, "<Q"), 1)


def read_gguf_info(path: Path) -> GGUFInfo:
    """Describe a GGUF file; NotGGUF if it is not one."""
    path = Path(path)
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise NotGGUF(f"{path} is not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise NotGGUF(f"{path}: GGUF version {version} is too old")
        n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = _string(f)
            kind = _read(f, "<I")
            meta[key] = _value(f, kind, keep=key != "tokenizer.chat_template")
            if key == "tokenizer.chat_template":
                meta[key] = True
        parameters = repackable = 0
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            kind = _read(f, "<I")
            f.seek(8, 1)  # offset
            count = 1
            for d in dims:
                count *= d
            parameters += count
            if (kind in REPACKED_TYPES and len(dims) == 2 and dims[1] % 8 == 0
                    and name != "token_embd.weight"):
                block, size = REPACKED_TYPES[kind]
                repackable += count // block * size
    arch = str(meta.get("general.architecture", "unknown"))

    def arch_int(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) else None

    heads, kv_heads = arch_int("attention.head_count"), arch_int("attention.head_count_kv")
    embd = arch_int("embedding_length")
    head_dim = arch_int("attention.key_length") or (embd // heads if embd and heads else None)
    file_type = meta.get("general.file_type")
    return GGUFInfo(
        path=path, size=path.stat().st_size, architecture=arch,
        name=str(meta.get("general.name", path.stem)), parameters=parameters,
        quantization=FILE_TYPES.get(file_type, f"type {file_type}") if file_type is not None
        else "unknown",
        context_length=arch_int("context_length"),
        has_chat_template=bool(meta.get("tokenizer.chat_template")),
        layers=arch_int("block_count"), kv_heads=kv_heads or heads, head_dim=head_dim,
        sliding_window=arch_int("attention.sliding_window"), repackable_bytes=repackable,
    )
