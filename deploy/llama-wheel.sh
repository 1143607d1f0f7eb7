#!/usr/bin/env bash
# Install llama-cpp-python (the version requirements.txt pins) into the venv whose python is $1,
# from a wheel built for this very CPU and kept in ~/.cache/reame/wheels/<key>/.
#
# Why not plain `pip install`: pip builds llama.cpp with -march=native and keeps that wheel in its
# cache under the package's name alone, so a wheel built on one CPU is reused on another (a
# different flag set: SIGILL). And on CPUs with AMX (Intel Sapphire Rapids and later) llama.cpp's
# AMX matrix kernel crashes here with SIGSEGV on the first decode, so AMX is left out of the build
# (-mno-amx-*); AVX-512 and VNNI stay. The key holds the CPU's flags, the build options and the
# version: another CPU, or other options, builds again (6-10 minutes on 2 cores).
set -euo pipefail
python=$1
version=$(sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$(dirname "$0")/../requirements.txt")
args="${CMAKE_ARGS:-}"
if [ "$(uname -m)" = x86_64 ]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    args="$args -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
fi
flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo || true)
key=$(printf '%s\n%s\n%s\n%s\n' "$version" "$args" "$flags" "$(uname -m)" | sha256sum | cut -c1-16)
dir="${REAME_WHEEL_CACHE:-$HOME/.cache/reame/wheels}/$key"
if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "Building llama-cpp-python $version for this CPU (6-10 minutes on 2 cores) into $dir"
    mkdir -p "$dir.tmp"
    CMAKE_ARGS="$args" "$python" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
        -w "$dir.tmp" "llama-cpp-python==$version"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
"$python" -m pip install "$dir"/llama_cpp_python-*.whl
