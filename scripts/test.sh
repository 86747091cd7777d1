#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs every test.
#
#   scripts/test.sh                    # AddressSanitizer + UBSan build in build/asan (the default:
#                                      # every test, the examples and the CLI, checked for memory
#                                      # errors, leaks and undefined behaviour)
#   scripts/test.sh --preset tsan      # ThreadSanitizer (CI runs this too)
#   scripts/test.sh --preset default   # RelWithDebInfo, no sanitizer
#   scripts/test.sh -- -R handler      # extra arguments after -- go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

preset=asan
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "usage: scripts/test.sh [--preset asan|tsan|default] [-- ctest args]" >&2; exit 2 ;;
  esac
done

scripts/install-deps.sh test
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
# Real servers for the Redis and PostgreSQL tests, on free ports, stopped afterwards (with the
# Redis Sentinel group the Sentinel tests fail over). In this command a test that finds no server
# fails instead of skipping.
export IDEM_REQUIRE_SERVERS=1
export IDEM_TEST_REDIS_SENTINEL=${IDEM_TEST_REDIS_SENTINEL:-1}
scripts/servers.sh ctest --preset "$preset" "${ctest_args[@]}"
