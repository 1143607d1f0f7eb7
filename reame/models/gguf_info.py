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

# A matrix's rows are recorded by the largest of these that divides them: llama.cpp repacks a
# matrix only if its rows are a multiple of its kernel's (repack.py).
ROW_MULTIPLES = (32, 16, 8, 4)

# ggml type -> (values per block, bytes per block), for the types a matrix may have
_BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22),
           7: (32, 24), 8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144),
           13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136), 39: (32, 17),
           41: (128, 18)}


# The tokens of one llama.cpp decode (its ubatch): the engine's n_batch. A sliding window's
# layers keep the window and one decode's worth of cells (kv_bytes_per_slot).
N_UBATCH = 512

# Layers in a window's cache, by architecture, as llama.cpp's loader makes them (its
# load_swa_pattern; llama-hparams.cpp set_swa_pattern): of each `pattern` layers, all but the
# last; 0: every layer. The default pattern, and the window where the header has none.
# <arch>.attention.sliding_window_pattern, a number or a flag per layer, overrides it.
WINDOW_PATTERNS = {"gemma2": (2, 4096), "gemma3": (6, None)}


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
    # The weights llama.cpp multiplies by (not the token embedding, which is looked up), as
    # (ggml type, row multiple, bytes) summed by type and multiple (ROW_MULTIPLES; 1: none):
    # what its CPU backend may repack at load, by this CPU's rule (repack.py).
    matrices: tuple[tuple[int, int, int], ...] = ()
    # The token embedding, likewise, when it is the output matrix too (no output.weight):
    # llama.cpp then multiplies by it as well, and a repacked copy of it is an extra copy.
    tied_output: tuple[int, int, int] | None = None
    # Of its layers, those whose KV llama.cpp keeps in a sliding window's cache (an
    # architecture of WINDOW_PATTERNS only; 0: none, or not known here).
    window_layers: int = 0

    def kv_bytes_per_token(self, kv_type: str) -> int | None:
        """K and V for every layer, at 2 bytes (f16) or 34/32 bytes (q8_0) per value."""
        if not (self.layers and self.kv_heads and self.head_dim):
            return None
        values = 2 * self.layers * self.kv_heads * self.head_dim
        return values * 2 if kv_type == "f16" else values * 34 // 32

    def kv_bytes_per_slot(self, n_ctx: int, kv_type: str, *, swa_full: bool = False,
                          n_ubatch: int = N_UBATCH) -> int | None:
        """The KV llama.cpp allocates for one sequence of n_ctx tokens (its cells kept apart:
        kv_unified off, n_ctx rounded up to 256 cells as llama.cpp does). Every layer at
        n_ctx cells, but a window layer (window_layers) without swa_full (as the engine
        loads a sliding-window model, llama_params.swa_full_for): llama.cpp's
        llama_kv_cache_iswa gives it the window and one decode, rounded up to 256 cells,
        at most n_ctx."""
        per_token = self.kv_bytes_per_token(kv_type)
        if per_token is None:
            return None
        cells = -(-n_ctx // 256) * 256
        if swa_full or not (self.window_layers and self.sliding_window):
            return per_token * cells
        window = min(cells, -(-(self.sliding_window + n_ubatch) // 256) * 256)
        per_layer = per_token // self.layers
        return per_layer * ((self.layers - self.window_layers) * cells
                            + self.window_layers * window)


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


def _flags(f: BinaryIO) -> list[bool] | None:
    """An array of numbers or booleans, as flags (None: of anything else, skipped)."""
    item, count = _read(f, "<I"), _read(f, "<Q")
    if item not in _SCALARS:
        for _ in range(count):
            _value(f, item, False)
        return None
    return [bool(_read(f, _SCALARS[item])) for _ in range(count)]


def _window_layers(arch: str, layers: int | None, window: int | None, pattern) -> int:
    """How many of the layers llama.cpp keeps in a sliding window's cache (WINDOW_PATTERNS):
    0 for an architecture not there, or a model without a window."""
    if arch not in WINDOW_PATTERNS or not layers or not window:
        return 0
    if isinstance(pattern, list):
        return sum(pattern[:layers])
    n = int(pattern) if isinstance(pattern, (int, float)) else WINDOW_PATTERNS[arch][0]
    return layers if n == 0 else sum(1 for il in range(layers) if il % n < n - 1)


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
            if key.endswith(".attention.sliding_window_pattern") and kind == _ARRAY:
                meta[key] = _flags(f)
                continue
            meta[key] = _value(f, kind, keep=key != "tokenizer.chat_template")
            if key == "tokenizer.chat_template":
                meta[key] = True
        parameters, matrices, names, embedding = 0, {}, set(), None
        for _ in range(n_tensors):
            name = _string(f)
            dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            kind = _read(f, "<I")
            f.seek(8, 1)  # offset
            count = 1
            for d in dims:
                count *= d
            parameters += count
            names.add(name)
            if len(dims) in (2, 3) and kind in _BLOCKS:  # a matrix, or a stack of experts'
                block, size = _BLOCKS[kind]
                multiple = next((m for m in ROW_MULTIPLES if dims[1] % m == 0), 1)
                key = (kind, multiple)
                if name == "token_embd.weight":
                    embedding = (*key, count // block * size)
                elif "embd" not in name:  # position and per-layer embeddings: looked up too
                    matrices[key] = matrices.get(key, 0) + count // block * size
    arch = str(meta.get("general.architecture", "unknown"))

    def arch_int(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) else None

    heads, kv_heads = arch_int("attention.head_count"), arch_int("attention.head_count_kv")
    embd = arch_int("embedding_length")
    head_dim = arch_int("attention.key_length") or (embd // heads if embd and heads else None)
    file_type = meta.get("general.file_type")
    layers, window = arch_int("block_count"), arch_int("attention.sliding_window")
    if window is None and arch in WINDOW_PATTERNS:
        window = WINDOW_PATTERNS[arch][1]  # llama.cpp's default window for it
    return GGUFInfo(
        path=path, size=path.stat().st_size, architecture=arch,
        name=str(meta.get("general.name", path.stem)), parameters=parameters,
        quantization=FILE_TYPES.get(file_type, f"type {file_type}") if file_type is not None
        else "unknown",
        context_length=arch_int("context_length"),
        has_chat_template=bool(meta.get("tokenizer.chat_template")),
        layers=layers, kv_heads=kv_heads or heads, head_dim=head_dim,
        sliding_window=window,
        matrices=tuple((*key, size) for key, size in sorted(matrices.items())),
        tied_output=embedding if "output.weight" not in names else None,
        window_layers=_window_layers(arch, layers, window,
                                     meta.get(f"{arch}.attention.sliding_window_pattern")),
    )
