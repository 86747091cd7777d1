#!/usr/bin/env bash
# The first command: the crash-and-replay demo on the embedded SQLite default, in a temp dir.
# Installs only what it needs (scripts/install-deps.sh's base list: a compiler, CMake, and the
# libraries of idem's core, its SQLite backend and its CLI; no servers), then configures the
# `demo` preset (build/demo: the libraries and the idem CLI, no tests, examples, benchmarks or
# soak run) and builds all of it, so `cmake --install build/demo --prefix DIR` works afterwards.
# Backends whose client libraries happen to be installed (Redis, PostgreSQL, RabbitMQ, Asio for
# the coroutine face) are built too, and their URLs then work in `idem demo --store/--broker`.
# Arguments go to `idem demo` (see `idem demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
log=$(mktemp)
echo "idem: configuring build/demo (cmake --preset demo)" >&2
if ! cmake --preset demo >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  exit 1
fi
sed -n 's/^-- idem: /idem: /p' "$log" >&2  # which backends and faces are built
rm -f "$log"
jobs=$(nproc)
echo "idem: building the libraries and the idem CLI ($jobs jobs)" >&2
cmake --build --preset demo -j "$jobs" >&2
echo >&2
exec build/demo/tools/idem/idem demo "$@"
