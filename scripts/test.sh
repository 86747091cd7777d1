#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs every test.
#
#   scripts/test.sh                 # RelWithDebInfo build in build/default
#   scripts/test.sh --preset asan   # AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh --preset tsan   # ThreadSanitizer
#   scripts/test.sh -- -R handler   # extra arguments after -- go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

preset=default
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "usage: scripts/test.sh [--preset default|asan|tsan] [-- ctest args]" >&2; exit 2 ;;
  esac
done

scripts/install-deps.sh
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
# Real servers for the Redis and PostgreSQL tests, on free ports, stopped afterwards. In this
# command a test that finds no server fails instead of skipping.
export IDEM_REQUIRE_SERVERS=1
scripts/servers.sh ctest --preset "$preset" "${ctest_args[@]}"
