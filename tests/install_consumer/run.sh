#!/usr/bin/env bash
# Installs the already-built idem into a temp prefix and builds + runs the consumer project.
# usage: run.sh BUILD_DIR [SANITIZERS]
set -euo pipefail
build_dir=$1
sanitize=${2:-}  # e.g. address,undefined: the installed libraries were built with it
flags=()
if [ -n "$sanitize" ]; then
  flags=(-DCMAKE_CXX_FLAGS="-fsanitize=$sanitize" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize")
fi
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" "${flags[@]}" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
