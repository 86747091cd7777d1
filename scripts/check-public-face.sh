#!/usr/bin/env bash
# The public face may not grow unseen: every header an installation holds is named in
# DESIGN-NOTES.md's "The public face" section (with the tier it belongs to and why), and the shared
# libraries export no more idem `detail` symbols than the ceiling written there, and none of the
# names a library's <name>.local-symbols list keeps out of its dynamic symbol table; and no
# installed header names a listed name the list says is not installed, or defines one it says is
# an incomplete type there.
#
#   scripts/check-public-face.sh PREFIX
#
# PREFIX is an installation of idem built with -DBUILD_SHARED_LIBS=ON (include/ and lib/). CI
# passes the one its install.shared test leaves in build/asan/tests/install_consumer/shared/prefix.
# A `detail` symbol is a defined dynamic symbol whose demangled name is in a namespace idem::detail
# or idem::<part>::detail (not Asio's, the standard library's or nlohmann's).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:?usage: scripts/check-public-face.sh PREFIX (an installed shared build of idem)}
notes=DESIGN-NOTES.md
[ -d "$prefix/include/idem" ] || { echo "check-public-face: no $prefix/include/idem" >&2; exit 2; }

# The section: from its heading to the next one.
section=$(awk '/^## [0-9]+\. The public face/ {on = 1; print; next} on && /^## / {exit} on' "$notes")
[ -n "$section" ] || { echo "check-public-face: $notes has no section \"The public face\"" >&2; exit 2; }

status=0
installed=$(cd "$prefix/include" && find idem -name '*.hpp' | sort)
named=$(grep -o 'idem/[a-z0-9_/]*\.hpp' <<<"$section" | sort -u)
unnamed=$(comm -23 <(echo "$installed") <(echo "$named"))
stale=$(comm -13 <(echo "$installed") <(echo "$named"))
if [ -n "$unnamed" ]; then
  echo "check-public-face: installed but not named in $notes (\"The public face\": say which tier"
  echo "  it belongs to and why, or keep it out of include/):"
  sed 's/^/    /' <<<"$unnamed"
  status=1
fi
if [ -n "$stale" ]; then
  echo "check-public-face: named in $notes (\"The public face\") but not installed:"
  sed 's/^/    /' <<<"$stale"
  status=1
fi

shopt -s nullglob
libs=("$prefix"/lib*/libidem_*.so)
[ ${#libs[@]} -gt 0 ] || { echo "check-public-face: no shared libidem_*.so under $prefix" >&2; exit 2; }
detail=0
per_lib=""
for lib in "${libs[@]}"; do
  n=$(nm -D --defined-only -C "$lib" | grep -cE ' idem::([a-z0-9_]+::)*detail::' || true)
  detail=$((detail + n))
  name=${lib##*/libidem_}
  per_lib="$per_lib ${name%.so} $n"
done

# Every name a <name>.local-symbols list keeps out of libidem_<name>.so (idem_local_symbols in
# cmake/IdemHelpers.cmake) is out of its dynamic symbol table: `name` matches a symbol that is the
# name or mentions it followed by a non-identifier character, `^name` one that starts so (the
# version script's patterns, as extended regular expressions on the demangled names).
while IFS= read -r list; do
  name=$(basename "$list" .local-symbols)
  lib="$prefix/lib/libidem_$name.so"
  [ -e "$lib" ] || lib=$(find "$prefix" -name "libidem_$name.so" | head -n 1)
  [ -n "$lib" ] && [ -e "$lib" ] || continue  # a part this installation does not have
  exported=$(nm -D --defined-only -C "$lib" | cut -d' ' -f3-)
  leaked=""
  while IFS= read -r entry; do
    case "$entry" in '' | '#'*) continue ;; esac
    if [[ "$entry" == ^* ]]; then
      pattern="^${entry#^}(\$|[^A-Za-z0-9_])"
    else
      pattern="^${entry}\$|${entry}[^A-Za-z0-9_]"
    fi
    hits=$(grep -cE "$pattern" <<<"$exported" || true)
    [ "$hits" -eq 0 ] || leaked="$leaked    $entry ($hits symbols)"$'\n'
  done <"$list"
  # A list entry stays right only while the headers agree with the reason it was listed for: a
  # name "declared only in headers that are not installed" that an installed header now names, or
  # an "incomplete type" that an installed header now defines, could be called by a program and
  # then fail to link against the shared library.
  reason=""
  while IFS= read -r entry; do
    case "$entry" in
      '# Declared only'*) reason=uninstalled; continue ;;
      '# Incomplete types'*) reason=incomplete; continue ;;
      '#'*) case "$entry" in '# '[A-Z]*) reason=other ;; esac; continue ;;
      '') continue ;;
    esac
    qualified=${entry#^}
    short=${qualified##*::}
    parts=${qualified#idem::}
    parts=${parts%::*}  # detail, redis::detail, ...
    # Headers that open the name's namespace (nested or not) or spell out its qualifiers; in
    # them, the name unqualified or after `detail::` (not asio::error::operation_aborted).
    used="(^|[^:A-Za-z0-9_])$short([^A-Za-z0-9_]|\$)|detail::$short([^A-Za-z0-9_]|\$)"
    defined="(class|struct) +$short( +final)? *[:{]"
    where=""
    for header in $(grep -rlw -- "$short" "$prefix/include/idem" || true); do
      inside=true
      if ! grep -qF -- "$parts::$short" "$header"; then
        for part in ${parts//::/ }; do
          grep -qE -- "namespace ([a-z0-9_]+::)*$part( \{|::)" "$header" || inside=false
        done
      fi
      $inside || continue
      code=$(sed 's|//.*$||' "$header")  # comments may name anything
      case "$reason" in
        uninstalled) grep -qE -- "$used" <<<"$code" && where="$where$header"$'\n' ;;
        incomplete) grep -qE -- "$defined" <<<"$code" && where="$where$header"$'\n' ;;
      esac
    done
    where=${where%$'\n'}
    if [ -n "$where" ]; then
      if [ "$reason" = incomplete ]; then
        echo "check-public-face: ${list#./} keeps $entry local as an incomplete type, but"
        echo "  an installed header now defines it (a program could use it and fail to link):"
      else
        echo "check-public-face: ${list#./} keeps $entry local as declared in no installed"
        echo "  header, but one now names it (a program could use it and fail to link):"
      fi
      sed "s|^$prefix/include/|    |" <<<"$where"
      echo "  Take it off the list (the symbol is then exported) or keep it out of the header."
      status=1
    fi
  done <"$list"
  if [ -n "$leaked" ]; then
    echo "check-public-face: $lib exports names ${list#./} keeps local (was it linked"
    echo "  without its version script?):"
    printf '%s' "$leaked"
    status=1
  fi
done < <(find . -name '*.local-symbols' -not -path './build/*' | sort)
ceiling=$(tr '\n' ' ' <<<"$section" | grep -oE 'at most [0-9,]+ exported +`detail` +symbols' |
          grep -oE '[0-9,]+' | tr -d , | head -n 1)
[ -n "$ceiling" ] || { echo "check-public-face: no \"at most N exported \`detail\` symbols\" line" >&2; exit 2; }
headers=$(wc -l <<<"$installed")
echo "check-public-face: $headers installed headers; $detail exported detail symbols (ceiling $ceiling)"
echo "  by library:$per_lib"
if [ "$detail" -gt "$ceiling" ]; then
  echo "check-public-face: the shared libraries export $detail idem detail symbols, more than the"
  echo "  $ceiling $notes allows: keep the new ones out of the dynamic symbol table (an anonymous"
  echo "  namespace, or the library's <name>.local-symbols list for an internal name no other"
  echo "  library calls), or raise the ceiling with a line saying what the ABI needs."
  status=1
fi
exit $status
