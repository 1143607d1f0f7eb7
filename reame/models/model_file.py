"""Model files before llama.cpp sees them: which GGUFs a folder holds, whether a path is one
(ModelLoadError, naming the path and what the folder holds, if not), and a cheap fingerprint
that tells model files apart.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reame.models.gguf_info import MAGIC as GGUF_MAGIC

_FINGERPRINT_SPAN = 1 << 20  # bytes hashed from the head and from the tail of the model file


class ModelLoadError(Exception):
    """The model file is missing, is not a GGUF, or llama.cpp cannot load it."""


def gguf_files(folder: Path) -> list[Path]:
    """The .gguf files under folder, sorted; empty when the folder does not exist."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.gguf") if p.is_file())


def _listing(models_dir: Path) -> str:
    found = gguf_files(models_dir)
    if not found:
        return f"No .gguf files found in {models_dir}."
    names = ", ".join(str(p.relative_to(models_dir)) for p in found)
    return f".gguf files in {models_dir}: {names}."


def check_model_file(path: Path, models_dir: Path) -> None:
    """Raise ModelLoadError, naming the path tried and what models_dir holds, unless path is
    a GGUF."""
    if not path.exists():
        raise ModelLoadError(
            f"Model file not found: {path} (No such file or directory). {_listing(models_dir)} "
            f"Set [model] model_path in reame.conf to one of them."
        )
    if not path.is_file():
        raise ModelLoadError(f"Model path is not a file: {path}. {_listing(models_dir)}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read model file {path}: {exc.strerror}.") from None
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            f"Not a GGUF model file: {path} (it starts with {magic!r}, not b'GGUF'). "
            f"{_listing(models_dir)}"
        )


def model_fingerprint(path: Path) -> str:
    """Size plus a hash of the head and tail of the file: cheap, and enough to tell models apart."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_FINGERPRINT_SPAN))
        handle.seek(max(0, size - _FINGERPRINT_SPAN))
        digest.update(handle.read(_FINGERPRINT_SPAN))
    return f"{size}-{digest.hexdigest()[:16]}"
