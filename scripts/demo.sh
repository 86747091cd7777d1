#!/usr/bin/env bash
# The main job: builds the idem CLI if needed and runs the crash-and-replay demo on the embedded
# SQLite default in a temp dir. Arguments go to `idem demo` (see `idem demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target idem >/dev/null
exec build/release/tools/idem/idem demo "$@"
