#!/usr/bin/env bash
# The soak run: builds idem_soak alone in build/release (the release preset),
# starts the test servers through scripts/servers.sh when Redis or PostgreSQL is asked for, and
# runs it. idem_soak prints one PASS/FAIL line per check and the totals per backend; this script
# exits non-zero when a check failed (or the build or a server did).
#
#   scripts/soak.sh [--seconds 600] [--backends sqlite,redis,postgres] [--workers 4]
#                   [--build-dir build/release]
#
# --seconds is per backend (CI: --seconds 20 runs the three backends in 60 s). --build-dir names
# another, already configured build tree (e.g. an ASan one); idem_soak is the only target built.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

seconds=600
backends=sqlite,redis,postgres
workers=4
build_dir=build/release
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --backends) backends=${2:?--backends needs a value}; shift 2 ;;
    --workers) workers=${2:?--workers needs a value}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done

if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  if [ "$build_dir" = build/release ]; then
    cmake --preset release >/dev/null
  else
    echo "soak.sh: $build_dir is not a configured build tree" >&2
    exit 2
  fi
fi
# Configure again so a tree configured before soak/ existed knows the target (quick when nothing
# changed).
cmake -S . -B "$build_dir" >/dev/null
# Only the soak program and what it links (core, the backends, idem::open): not the whole tree.
cmake --build "$build_dir" -j2 --target idem_soak

soak=("$build_dir/soak/idem_soak" --seconds "$seconds" --backends "$backends" --workers "$workers")
case ",$backends," in
  *,redis,*|*,postgres,*) exec scripts/servers.sh "${soak[@]}" ;;
  *) exec "${soak[@]}" ;;
esac
