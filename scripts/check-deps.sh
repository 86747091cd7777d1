#!/usr/bin/env bash
# Fails when a configured build tree uses a file that a fresh machine would not have: every file
# or directory the configure step found (CMakeCache entries *_DIR, *_INCLUDE_DIR(S), *_LIBRARY,
# *_LIBRARY_DIRS, *_EXECUTABLE, the compilers and tools, pkg-config's pkgcfg_lib_* results) must
# belong to a Debian package that scripts/install-deps.sh lists or that a listed package pulls in
# (Depends/Pre-Depends, recursively). A file of an unlisted package, or of no package at all
# (/usr/local, a hand-built copy), is named with its package and the check fails.
#
#   scripts/check-deps.sh [BUILD_DIR...]        default: every build/*/ that holds a CMakeCache.txt
#   scripts/check-deps.sh --packages "a b" DIR  check against this package list instead of
#                                               `scripts/install-deps.sh --list all`
#
# .ci/run runs it right after configuring, so a package installed by hand on the machine CI runs
# on cannot hide a missing install step again.
set -euo pipefail
cd "$(dirname "$0")/.."

listed=""
if [ "${1:-}" = "--packages" ]; then
  listed=$2
  shift 2
else
  listed=$(scripts/install-deps.sh --list all)
fi

dirs=("$@")
if [ ${#dirs[@]} -eq 0 ]; then
  for cache in build/*/CMakeCache.txt; do
    [ -f "$cache" ] && dirs+=("$(dirname "$cache")")
  done
fi
[ ${#dirs[@]} -gt 0 ] || { echo "check-deps: no configured build tree (run cmake --preset ...)" >&2; exit 2; }

# The listed packages and everything they depend on, as installed here (names without :arch).
# shellcheck disable=SC2086
closure=$(apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances $listed 2>/dev/null \
          | grep -v '^ ' | tr -d '<>' | sed 's/:.*//' | sort -u)
closure=$(printf '%s\n%s\n' "$closure" "$(printf '%s\n' $listed)" | sort -u)

# Paths the configure step found: absolute paths from the cache entries that name found files.
paths_of() {
  local cache=$1/CMakeCache.txt source build
  source=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  build=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$cache")
  grep -E '^[A-Za-z0-9_.+-]+:(FILEPATH|PATH|INTERNAL)=' "$cache" \
    | grep -E '^([A-Za-z0-9_.+-]+_(DIR|INCLUDE_DIRS?|LIBRARY(_RELEASE|_DEBUG)?|LIBRARY_DIRS|EXECUTABLE|COMPILER|COMPILER_AR|COMPILER_RANLIB)|pkgcfg_lib_[A-Za-z0-9_.+-]+|CMAKE_(AR|RANLIB|LINKER|NM|OBJCOPY|OBJDUMP|STRIP|READELF|ADDR2LINE|MAKE_PROGRAM)):' \
    | grep -v -E '^(CMAKE_CACHEFILE_DIR|CMAKE_HOME_DIRECTORY|CMAKE_FIND_PACKAGE_REDIRECTS_DIR|[A-Za-z0-9_]+_(BINARY|SOURCE)_DIR):' \
    | sed 's/^[^=]*=//' | tr ';' '\n' \
    | grep -E '^/' | grep -v -E 'NOTFOUND$' \
    | grep -v -F -e "$source/" -e "$build/" || true
}

owner_of() {  # the package(s) owning a path, trying its resolved and /usr-merged spellings
  local path=$1 real candidates=() c out
  real=$(realpath -m "$path")
  candidates=("$path" "$real")
  for c in "$path" "$real"; do
    case "$c" in
      /usr/lib/*|/usr/bin/*|/usr/sbin/*) candidates+=("${c#/usr}") ;;
      /lib/*|/bin/*|/sbin/*) candidates+=("/usr$c") ;;
    esac
  done
  for c in "${candidates[@]}"; do
    out=$(dpkg-query -S "$c" 2>/dev/null | grep -F ": $c" | head -n 1 | sed 's/: \/.*//') || true
    if [ -n "$out" ]; then
      echo "$out" | tr ',' '\n' | sed 's/^ *//; s/:.*//'
      return 0
    fi
  done
  return 1
}

failed=0
checked=0
declare -A seen=()
for dir in "${dirs[@]}"; do
  [ -f "$dir/CMakeCache.txt" ] || { echo "check-deps: $dir has no CMakeCache.txt" >&2; exit 2; }
  while IFS= read -r path; do
    [ -n "$path" ] || continue
    [ -z "${seen[$path]:-}" ] || continue
    seen[$path]=1
    [ -e "$path" ] || continue
    checked=$((checked + 1))
    if ! owners=$(owner_of "$path"); then
      echo "check-deps: $path (found by configuring $dir) belongs to no Debian package" >&2
      failed=1
      continue
    fi
    ok=0
    while IFS= read -r pkg; do
      if grep -qx -F "$pkg" <<<"$closure"; then ok=1; break; fi
    done <<<"$owners"
    if [ $ok -eq 0 ]; then
      echo "check-deps: $path (found by configuring $dir) belongs to $(echo "$owners" | paste -sd' ' -)," \
           "which scripts/install-deps.sh neither lists nor pulls in: add it there" >&2
      failed=1
    fi
  done < <(paths_of "$dir")
done

if [ $failed -ne 0 ]; then
  echo "check-deps: FAILED: a fresh machine would not have what this build found" >&2
  exit 1
fi
echo "check-deps: ${checked} files found by configuring ${dirs[*]} all come from packages scripts/install-deps.sh installs"
