#!/usr/bin/env bash
# The public face may not grow unseen: every header an installation holds is named in
# DESIGN-NOTES.md's "The public face" section (with the tier it belongs to and why), and the shared
# libraries export no more idem `detail` symbols than the ceiling written there.
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
for lib in "${libs[@]}"; do
  n=$(nm -D --defined-only -C "$lib" | grep -cE ' idem::([a-z0-9_]+::)*detail::' || true)
  detail=$((detail + n))
done
ceiling=$(tr '\n' ' ' <<<"$section" | grep -oE 'at most [0-9,]+ exported +`detail` +symbols' |
          grep -oE '[0-9,]+' | tr -d , | head -n 1)
[ -n "$ceiling" ] || { echo "check-public-face: no \"at most N exported \`detail\` symbols\" line" >&2; exit 2; }
headers=$(wc -l <<<"$installed")
echo "check-public-face: $headers installed headers; $detail exported detail symbols (ceiling $ceiling)"
if [ "$detail" -gt "$ceiling" ]; then
  echo "check-public-face: the shared libraries export $detail idem detail symbols, more than the"
  echo "  $ceiling $notes allows: keep the new ones out of the dynamic symbol table (an internal"
  echo "  header, an anonymous namespace), or raise the ceiling with a line saying what the ABI needs."
  status=1
fi
exit $status
