#!/usr/bin/env bash
# scripts/check-deps.sh names the package a configured build found but install-deps.sh does not
# install, and passes once the package is listed. Runs on a made-up CMakeCache.txt whose entries
# point at real files of installed packages (libfmt-dev's CMake config, nlohmann-json3-dev's) and
# at a file of no package.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fmt_dir=$(dirname "$(dpkg-query -L libfmt-dev | grep -m1 'fmt-config.cmake$')")
json_dir=$(dirname "$(dpkg-query -L nlohmann-json3-dev | grep -m1 'nlohmann_jsonConfig.cmake$')")
mkdir -p "$work/tree"
cat >"$work/tree/CMakeCache.txt" <<TXT
CMAKE_HOME_DIRECTORY:INTERNAL=$root
CMAKE_CACHEFILE_DIR:INTERNAL=$work/tree
fmt_DIR:PATH=$fmt_dir
nlohmann_json_DIR:PATH=$json_dir
Missing_DIR:PATH=Missing_DIR-NOTFOUND
CMAKE_INSTALL_BINDIR:PATH=bin
TXT

fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. libfmt-dev not listed: refused, naming the package.
if "$root/scripts/check-deps.sh" --packages "nlohmann-json3-dev" "$work/tree" >"$work/out" 2>&1; then
  fail "check-deps passed although libfmt-dev is not listed"
fi
grep -q "belongs to libfmt-dev" "$work/out" || fail "the message does not name libfmt-dev: $(cat "$work/out")"
grep -q "nlohmann" "$work/out" && fail "a listed package was reported: $(cat "$work/out")"

# 2. Both listed: passes.
"$root/scripts/check-deps.sh" --packages "nlohmann-json3-dev libfmt-dev" "$work/tree" >"$work/out" 2>&1 \
  || fail "check-deps refused listed packages: $(cat "$work/out")"

# 3. A file that no package owns (a hand-installed copy): refused.
mkdir -p "$work/local/lib/cmake/fmt"
touch "$work/local/lib/cmake/fmt/fmt-config.cmake"
sed -i "s|^fmt_DIR:PATH=.*|fmt_DIR:PATH=$work/local/lib/cmake/fmt|" "$work/tree/CMakeCache.txt"
if "$root/scripts/check-deps.sh" --packages "nlohmann-json3-dev libfmt-dev" "$work/tree" >"$work/out" 2>&1; then
  fail "check-deps passed a file of no package"
fi
grep -q "belongs to no Debian package" "$work/out" || fail "unexpected message: $(cat "$work/out")"

# 4. A package pulled in by a listed one counts as installed: libfmt-dev depends on libfmt9.
fmt_lib=$(dpkg-query -L libfmt9 | grep -m1 '\.so\.')
sed -i "s|^fmt_DIR:PATH=.*|fmt_LIBRARY:FILEPATH=$fmt_lib|" "$work/tree/CMakeCache.txt"
"$root/scripts/check-deps.sh" --packages "nlohmann-json3-dev libfmt-dev" "$work/tree" >"$work/out" 2>&1 \
  || fail "a dependency of a listed package was refused: $(cat "$work/out")"
echo "check-deps: 4 cases passed"
