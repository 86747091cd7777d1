#!/usr/bin/env bash
# The three ways a user's project gets idem, each building and running the consumer programs of
# this directory (main.cpp: idem::core + idem::sqlite + idem::open; open_main.cpp: idem::open only):
#
#   run.sh installed BUILD_DIR SETTINGS WORK   cmake --install an already-built idem (the test
#                                              build itself, static by default), find_package it,
#                                              and build the programs again through pkg-config
#   run.sh shared SETTINGS WORK                build idem's libraries with -DBUILD_SHARED_LIBS=ON,
#                                              install them, find_package them; check every
#                                              library's SONAME and RUNPATH, and that the programs
#                                              load the installed .so files and need none of the
#                                              client libraries' CMake packages or link flags
#                                              (through find_package and through pkg-config)
#   run.sh subdirectory SETTINGS WORK          a project that add_subdirectory()s idem's source
#
# SETTINGS is a cmake -C file with the test build's compiler, launcher (ccache), build type, flags,
# sanitizers and parts (tests/CMakeLists.txt writes it), so every build here compiles like it.
# WORK is kept between runs: the builds in it are incremental.
set -euo pipefail
mode=$1
shift
source_dir=$(cd "$(dirname "$0")" && pwd)
idem_dir=$(cd "$source_dir/../.." && pwd)
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

fail() {
  echo "install test ($mode): $*" >&2
  exit 1
}
# run LOG COMMAND...: quiet unless it fails.
run() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { tail -n 60 "$log" >&2; fail "failed: $* (log: $log)"; }
}

# check_shared PREFIX: every exported component is a shared library with a versioned SONAME,
# whose symlink is installed, and a RUNPATH of $ORIGIN.
check_shared() {
  local prefix=$1 libdir config component lib soname runpath count=0
  config=$(dirname "$(find "$prefix" -name idemConfig.cmake | head -n 1)")
  libdir=$(cd "$config/../.." && pwd)
  for config in "$libdir"/cmake/idem/idem-*-targets.cmake; do
    component=${config##*/idem-}
    component=${component%-targets.cmake}
    case "$component" in *-*) continue ;; testing) continue ;; esac  # per-config files; header-only
    lib=$libdir/libidem_$component.so
    [ -e "$lib" ] || fail "idem::$component is not installed as $lib"
    soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [[ "$soname" =~ ^libidem_$component\.so\.[0-9]+(\.[0-9]+)?$ ]] || fail "$lib: SONAME '$soname'"
    [ -L "$libdir/$soname" ] || fail "$libdir/$soname (the SONAME's link) is missing"
    runpath=$(readelf -d "$lib" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
    [ "$runpath" = '$ORIGIN' ] || fail "$lib: RUNPATH '$runpath', expected \$ORIGIN"
    echo "  $(basename "$(readlink -f "$lib")")  SONAME $soname  RUNPATH $runpath"
    count=$((count + 1))
  done
  [ "$count" -ge 3 ] || fail "only $count shared libraries in $libdir"
}

# check_loads PROGRAM PREFIX: the program loads every idem library from PREFIX.
check_loads() {
  local program=$1 prefix=$2 libs
  libs=$(ldd "$program" | grep 'libidem_') || fail "$program loads no libidem_*.so"
  if grep -v "=> $prefix/" <<<"$libs" >&2; then
    fail "$program loads the libraries above from outside $prefix"
  fi
  echo "  $(basename "$program"): $(awk '{print $1}' <<<"$libs" | sort | tr '\n' ' ')"
}

# consumer SETTINGS WORK PREFIX SHARED: configure, build and run the find_package consumer.
consumer() {
  local settings=$1 work=$2 prefix=$3 shared=$4 no_client=()
  if [ "$shared" = yes ]; then
    # Shared libraries carry their client libraries themselves: idemConfig must not look for
    # their packages (a consumer needs no backend's development package).
    no_client=(-DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=ON
      -DCMAKE_DISABLE_FIND_PACKAGE_Hiredis=ON -DCMAKE_DISABLE_FIND_PACKAGE_PostgreSQL=ON
      -DCMAKE_DISABLE_FIND_PACKAGE_rabbitmq-c=ON)
  fi
  rm -rf "$work/consumer"  # a fresh build, so its link lines are in the log
  run "$work/consumer-configure.log" cmake -S "$source_dir" -B "$work/consumer" -C "$settings" \
    -DCMAKE_PREFIX_PATH="$prefix" "${no_client[@]}"
  run "$work/consumer-build.log" cmake --build "$work/consumer" -j "$jobs" -v
  "$work/consumer/consumer"
  "$work/consumer/consumer_open"
  if [ "$shared" = yes ]; then
    check_loads "$work/consumer/consumer" "$prefix"
    check_loads "$work/consumer/consumer_open" "$prefix"
    # idem::open's backends are private: the program links libidem_open.so and libidem_core.so,
    # and neither a backend nor its client library appears on its link line.
    local link
    link=$(grep -E ' -o consumer_open( |$)' "$work/consumer-build.log") ||
      fail "no link line for consumer_open in $work/consumer-build.log"
    grep -q 'libidem_open\.so' <<<"$link" || fail "consumer_open does not link libidem_open.so"
    if grep -oE 'lib(idem_(sqlite|redis|postgres)|sqlite3|pq|hiredis|rabbitmq|ssl|crypto)\.[^ ]*' \
      <<<"$link" >&2; then
      fail "consumer_open's link line names the backend or client libraries above"
    fi
  fi
}

# pkgconfig_consumer SETTINGS WORK PREFIX SHARED: every installed idem-*.pc is valid, resolves
# (with --static too) and names only libraries that are installed, one for every component the
# CMake package exports; then the two programs are built again without CMake, with the compiler
# and flags of SETTINGS and everything else from `pkg-config --cflags --libs`, and run. Shared:
# idem-open's link line names neither a backend nor a client library.
pkgconfig_consumer() {
  local settings=$1 work=$2 prefix=$3 shared=$4 pcdir libdir pc module libs lib config component
  pcdir=$(dirname "$(find "$prefix" -name idem-core.pc | head -n 1)")
  [ -f "$pcdir/idem-core.pc" ] || fail "no idem-core.pc installed under $prefix"
  libdir=$(cd "$pcdir/.." && pwd)
  export PKG_CONFIG_PATH=$pcdir
  for config in "$libdir"/cmake/idem/idem-*-targets.cmake; do
    component=${config##*/idem-}
    component=${component%-targets.cmake}
    case "$component" in *-*) continue ;; esac  # per-configuration files
    [ -f "$pcdir/idem-$component.pc" ] || fail "idem::$component is installed without idem-$component.pc"
  done
  for pc in "$pcdir"/idem-*.pc; do
    module=$(basename "$pc" .pc)
    pkg-config --validate "$module" || fail "$pc is not a valid pkg-config file"
    for static in "" --static; do
      libs=$(pkg-config --cflags --libs $static "$module" 2>&1) ||
        fail "pkg-config --cflags --libs $static $module: $libs"
      for lib in $(grep -oE -- '-lidem_[a-z0-9_]+' <<<"$libs"); do
        lib=lib${lib#-l}
        [ -e "$libdir/$lib.a" ] || [ -e "$libdir/$lib.so" ] ||
          fail "$module names -l${lib#lib}, but $libdir has no $lib.a or $lib.so"
      done
    done
  done
  echo "  pkg-config: $(ls "$pcdir" | grep -c '^idem-.*\.pc$') files valid, every library they name installed"

  # The compiler, flags and sanitizers of the test build, read from SETTINGS (a cmake -C file).
  setting() { sed -n "s/^set($1 \"\(.*\)\" CACHE.*/\1/p" "$settings"; }
  local cxx build_type flags launcher sanitize out=$work/pkgconfig rpath=()
  cxx=$(setting CMAKE_CXX_COMPILER)
  build_type=$(setting CMAKE_BUILD_TYPE)
  flags="$(setting CMAKE_CXX_FLAGS) $(setting "CMAKE_CXX_FLAGS_${build_type^^}")"
  launcher=$(setting CMAKE_CXX_COMPILER_LAUNCHER)
  sanitize=$(setting IDEM_SANITIZE)
  [ -n "$sanitize" ] && flags="$flags -fsanitize=$sanitize"
  [ "$shared" = yes ] && rpath=("-Wl,-rpath,$libdir")
  rm -rf "$out"
  mkdir -p "$out"
  # build OUTPUT SOURCE MODULE...: one program, compiled and linked with what pkg-config says.
  build() {
    local output=$1 source=$2
    shift 2
    local cflags link
    cflags=$(pkg-config --cflags "$@")
    link=$(pkg-config --libs "$@")
    echo "$cxx -std=c++20 $flags $cflags $source -o $output $link ${rpath[*]}" >>"$out/build.log"
    # shellcheck disable=SC2086
    $launcher "$cxx" -std=c++20 $flags $cflags "$source_dir/$source" -o "$out/$output" $link \
      "${rpath[@]}" >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log" >&2; fail "building $output with pkg-config failed (log: $out/build.log)"; }
  }
  build consumer main.cpp idem-sqlite idem-open
  build consumer_open open_main.cpp idem-open
  "$out/consumer"
  "$out/consumer_open"
  if [ "$shared" = yes ]; then
    check_loads "$out/consumer" "$prefix"
    check_loads "$out/consumer_open" "$prefix"
    if grep -oE 'lidem_(sqlite|redis|postgres)|lsqlite3|lpq|lhiredis|lrabbitmq|lssl|lcrypto' \
      <<<"$(pkg-config --libs idem-open)" >&2; then
      fail "pkg-config --libs idem-open names the backend or client libraries above"
    fi
  fi
  echo "  pkg-config consumers built and ran"
}

case "$mode" in
  installed)
    build_dir=$1 settings=$2 work=$3
    mkdir -p "$work"
    rm -rf "$work/prefix"
    run "$work/install.log" cmake --install "$build_dir" --prefix "$work/prefix"
    shared=no
    if find "$work/prefix" -name 'libidem_core.so' | grep -q .; then
      shared=yes
      check_shared "$work/prefix"
    fi
    consumer "$settings" "$work" "$work/prefix" "$shared"
    pkgconfig_consumer "$settings" "$work" "$work/prefix" "$shared"
    ;;
  shared)
    settings=$1 work=$2
    mkdir -p "$work"
    # Only the libraries: no tests, tools, examples, benchmarks or soak program.
    run "$work/idem-configure.log" cmake -S "$idem_dir" -B "$work/idem" -C "$settings" \
      -DBUILD_SHARED_LIBS=ON -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_TOOLS=OFF \
      -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_SOAK=OFF -DIDEM_INSTALL=ON
    run "$work/idem-build.log" cmake --build "$work/idem" -j "$jobs"
    rm -rf "$work/prefix"
    run "$work/install.log" cmake --install "$work/idem" --prefix "$work/prefix"
    check_shared "$work/prefix"
    consumer "$settings" "$work" "$work/prefix" yes
    pkgconfig_consumer "$settings" "$work" "$work/prefix" yes
    ;;
  subdirectory)
    settings=$1 work=$2
    mkdir -p "$work"
    run "$work/configure.log" cmake -S "$source_dir/subdirectory" -B "$work/build" -C "$settings" \
      -DIDEM_SOURCE_DIR="$idem_dir"
    # Building the programs builds just the idem libraries they link.
    run "$work/build.log" cmake --build "$work/build" -j "$jobs" --target consumer consumer_open
    "$work/build/consumer"
    "$work/build/consumer_open"
    ;;
  *)
    fail "unknown mode (installed, shared, subdirectory)"
    ;;
esac
