#!/usr/bin/env bash
# Installs the Debian packages idem needs to build, test and run its demo — only those missing.
# Needs root (or sudo) when something is missing; does nothing otherwise.
#
#   scripts/install-deps.sh [GROUP...]          install the base list plus the groups
#   scripts/install-deps.sh --list [GROUP...]   print the packages, one a line (scripts/check-deps.sh)
set -euo pipefail

list_only=false
if [ "${1:-}" = "--list" ]; then
  list_only=true
  shift
fi

packages=(
  g++ cmake make pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev nlohmann-json3-dev libcli11-dev libfmt-dev libsqlite3-dev sqlite3 libasio-dev
  libhiredis-dev libpq-dev librabbitmq-dev redis-server redis-tools postgresql rabbitmq-server
  openssl
  python3
  # promtool (package prometheus): the tests check idem's Prometheus text (idem::Metrics,
  # `idem stats --format prometheus`) with `promtool check metrics` (tests/promtool.hpp).
  prometheus
)
# Extra groups: `format` adds clang-format (CI's check); `fuzz` adds clang, its libFuzzer
# runtime and the LLVM binutils and linker it finds (scripts/fuzz.sh); `tools` adds what linting,
# plotting and faster rebuilds need; `all` is every group.
for group in "$@"; do
  case "$group" in
    format) packages+=(clang-format) ;;
    fuzz) packages+=(clang libclang-rt-14-dev llvm lld) ;;
    tools) packages+=(clang-format clang-tidy python3-matplotlib ccache) ;;
    all) packages+=(clang-format clang libclang-rt-14-dev llvm lld clang-tidy python3-matplotlib ccache) ;;
    *) echo "install-deps.sh: unknown group '$group'" >&2; exit 2 ;;
  esac
done

if $list_only; then
  printf '%s\n' "${packages[@]}" | sort -u
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "idem: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "idem: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
