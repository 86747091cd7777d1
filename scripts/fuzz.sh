#!/usr/bin/env bash
# Builds idem's libFuzzer targets (clang, ASan+UBSan; the `fuzz` preset) and runs each one for a
# bounded time, two at a time:
#
#   scripts/fuzz.sh                 # every fuzzer, IDEM_FUZZ_SECONDS each (default 30)
#   scripts/fuzz.sh url report      # just these
#
# Each fuzzer starts from its seed corpus (fuzz/corpus/<name>/, copied: the repository's corpus is
# not changed) and first replays every input that once crashed it (fuzz/regressions/<name>/).
# A crash leaves its input in build/fuzz/artifacts/<name>/ and fails the script: add that file to
# fuzz/regressions/<name>/ (and a unit test for the bug) when fixing it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${IDEM_FUZZ_SECONDS:-30}
# Any sanitizer report is a failure (the build also compiles with -fno-sanitize-recover).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
scripts/install-deps.sh test fuzz  # the fuzzers cover every backend's records
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for binary in build/fuzz/fuzz/fuzz_*; do names+=("${binary##*/fuzz_}"); done
fi

run_one() {
  local name=$1 work=build/fuzz/work/$1 artifacts=build/fuzz/artifacts/$1
  rm -rf "$work"
  mkdir -p "$work" "$artifacts"
  local regressions=()
  if compgen -G "fuzz/regressions/$name/*" >/dev/null; then regressions=(fuzz/regressions/"$name"/*); fi
  if [ ${#regressions[@]} -gt 0 ]; then
    "build/fuzz/fuzz/fuzz_$name" "${regressions[@]}" >"$work.regressions.log" 2>&1 || {
      echo "fuzz $name: a regression input crashes again" >&2
      tail -n 40 "$work.regressions.log" >&2
      return 1
    }
  fi
  if "build/fuzz/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "fuzz/corpus/$name" \
    >"$work.log" 2>&1; then
    echo "fuzz $name: $(grep -a -o 'Done [0-9]* runs in [0-9]* second(s)' "$work.log" | tail -n 1)," \
      "${#regressions[@]} regression input(s) replayed"
  else
    echo "fuzz $name: FAILED (input in $artifacts/)" >&2
    grep -a -E -A 30 "ERROR|invariant broken|threw" "$work.log" | head -n 60 >&2
    return 1
  fi
}

status=0
pids=()
for name in "${names[@]}"; do
  [ -x "build/fuzz/fuzz/fuzz_$name" ] || { echo "fuzz.sh: no fuzzer '$name'" >&2; exit 2; }
  run_one "$name" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
