#!/usr/bin/env bash
# Builds idem with all optional parts off (-DIDEM_WITH_SQLITE=OFF, ..._REDIS, ..._POSTGRES,
# ..._RABBITMQ): the core, idem::open, the CLI, the examples and the soak program must build
# without any backend, so that a user who lacks a client library still gets the rest. Then with
# each part off alone, the two targets that choose code by the parts they have (idem::open and
# the CLI). The tests are left out (each test file is already built only with its part); ccache
# is used when it is installed, so what every build shares compiles once.
#
#   scripts/check-backends-off.sh [PART...]     default: all sqlite redis postgres rabbitmq
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(all sqlite redis postgres rabbitmq)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

for part in "${parts[@]}"; do
  off=()
  case "$part" in
    sqlite|redis|postgres|rabbitmq) off=("-DIDEM_WITH_${part^^}=OFF") ;;
    all) off=(-DIDEM_WITH_SQLITE=OFF -DIDEM_WITH_REDIS=OFF -DIDEM_WITH_POSTGRES=OFF -DIDEM_WITH_RABBITMQ=OFF) ;;
    *) echo "check-backends-off: unknown part '$part' (sqlite, redis, postgres, rabbitmq, all)" >&2; exit 2 ;;
  esac
  dir=build/off-$part
  echo "check-backends-off: ${off[*]}"
  # No build type: no optimisation and no debug info, the cheapest compile that still sees every
  # include and every symbol.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE= -DIDEM_WERROR=ON "${launcher[@]}" "${off[@]}" \
    -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=ON -DIDEM_BUILD_TOOLS=ON \
    -DIDEM_BUILD_SOAK=ON >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  grep -E '^-- idem: (backends|transports):' "$dir.log" | sed 's/^/  /'
  targets=()
  [ "$part" = all ] || targets=(--target idem idem_open)
  cmake --build "$dir" -j "$(nproc)" "${targets[@]}" >>"$dir.log" 2>&1 || { tail -n 40 "$dir.log" >&2; echo "check-backends-off: the build with ${off[*]} failed (log: $dir.log)" >&2; exit 1; }
  # The CLI still answers, and says what a missing backend means.
  "$dir/tools/idem/idem" --version >/dev/null
done
echo "check-backends-off: every build passed (${parts[*]})"
