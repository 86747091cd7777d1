#!/usr/bin/env bash
# Installs the Debian packages idem needs — only those missing. Needs root (or sudo) when
# something is missing; does nothing otherwise.
#
#   scripts/install-deps.sh [GROUP...]          install the base list plus the groups
#   scripts/install-deps.sh --list [GROUP...]   print the packages, one a line (scripts/check-deps.sh)
#
# The base list is what the demo needs (scripts/demo.sh): a compiler, CMake (and pkg-config,
# which CMake's FindOpenSSL asks), and the libraries of idem's core, its SQLite backend and its
# CLI. Nothing in it starts a service.
# Groups:
#   test    everything else the tests use (scripts/test.sh): GoogleTest, Google Benchmark, the
#           coroutine face's Asio, the Redis, PostgreSQL and RabbitMQ client libraries, and the
#           servers scripts/servers.sh runs for the tests (redis-server, postgresql and
#           rabbitmq-server: installing the last two on Debian also starts them as services);
#           the sqlite3 shell, fmt (the soak run), openssl and python3 (scripts/servers.sh);
#           for `idem proxy` and idem::http, Boost.Beast (header-only) to parse HTTP/1.1, toml++
#           for its route file, cpp-httplib for examples/http_middleware.cpp, and curl and
#           Python's requests and aiohttp to drive it and serve as its upstream in the tests;
#           promtool (package prometheus), which checks idem's Prometheus text (idem::Metrics,
#           `idem stats --format prometheus`) in the tests (tests/promtool.hpp)
#   format  clang-format (CI's check)
#   fuzz    clang, its libFuzzer runtime and the LLVM binutils and linker it finds (scripts/fuzz.sh)
#   tools   what linting, plotting and faster rebuilds need
#   bench   wrk and nginx (bench/http_proxy_bench.sh), perf (profiling what a benchmark runs);
#           Node.js >= 20 with npm, which run the Node peers of bench/redis_peers.sh
#   all     every group
set -euo pipefail

list_only=false
if [ "${1:-}" = "--list" ]; then
  list_only=true
  shift
fi

packages=(
  g++ cmake make pkg-config
  libssl-dev nlohmann-json3-dev libcli11-dev libsqlite3-dev
)
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev sqlite3 libasio-dev
  libhiredis-dev libpq-dev librabbitmq-dev redis-server redis-tools postgresql rabbitmq-server
  openssl python3
  libboost-dev libtomlplusplus-dev libcpp-httplib-dev curl python3-requests python3-aiohttp
  prometheus
)
format_packages=(clang-format)
fuzz_packages=(clang libclang-rt-14-dev llvm lld)
tools_packages=(clang-format clang-tidy python3-matplotlib ccache)
bench_packages=(wrk nginx-light linux-perf nodejs)
for group in "$@"; do
  case "$group" in
    test) packages+=("${test_packages[@]}") ;;
    format) packages+=("${format_packages[@]}") ;;
    fuzz) packages+=("${fuzz_packages[@]}") ;;
    tools) packages+=("${tools_packages[@]}") ;;
    bench) packages+=("${bench_packages[@]}") ;;
    all) packages+=("${test_packages[@]}" "${format_packages[@]}" "${fuzz_packages[@]}"
                    "${tools_packages[@]}" "${bench_packages[@]}") ;;
    *) echo "install-deps.sh: unknown group '$group' (test, format, fuzz, tools, bench, all)" >&2
       exit 2 ;;
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
