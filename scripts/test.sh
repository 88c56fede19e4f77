#!/usr/bin/env bash
# The whole test suite: installs dependencies if missing, builds in build/
# (release) and runs every suite (core, collectives, mpi, data, fusion, gpu,
# odr) with meson test. GPU tests report SKIP without a device.
#   scripts/test.sh              release build in build/
#   scripts/test.sh --sanitize   -Db_sanitize=address,undefined build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
. scripts/env.sh
builddir=build
opts=(--buildtype=release)
if [ "${1:-}" = "--sanitize" ]; then
  builddir=build-asan
  # Only the test suite is checked under the sanitizers: no benchmarks,
  # examples or nvcc objects (GPU tests skip without a device anyway), -O1.
  opts=(--buildtype=debug -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false
        -Dcuda=disabled -Dbenchmarks=disabled -Dexamples=disabled)
  export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
if [ -d "$builddir/meson-info" ]; then
  meson configure "$builddir" "${opts[@]}" >/dev/null
else
  meson setup "$builddir" "${opts[@]}"
fi
ninja -C "$builddir"
meson test -C "$builddir" --print-errorlogs --num-processes 2
