#!/usr/bin/env bash
# The whole test suite: installs dependencies if missing, builds in build/
# (release) and runs every suite (core, collectives, mpi, data, fusion, bench, torch, gpu,
# odr) with meson test, then the Python package's pytest (scripts/python_test.sh).
# GPU tests report SKIP without a device.
#   scripts/test.sh              release build in build/
#   scripts/test.sh --sanitize   clang-14 -Db_sanitize=address,undefined build in build-asan/
#   scripts/test.sh --tsan       clang-14 ThreadSanitizer build in build-tsan/ of the
#                                threaded suites (inproc collectives, fusion; no MPI)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
. scripts/env.sh
builddir=build
opts=(--buildtype=release)
suites=()
if [ "${1:-}" = "--tsan" ]; then
  builddir=build-tsan
  export CC=clang-14 CXX=clang++-14
  # -DDPKIT_TEST_TYPES_THREADS: the typed collective tests run float and int8
  # only (tests/collectives/common.hpp: which thread touches what does not
  # depend on the element type); line tables are all TSan's reports need
  # -Dextern_templates=false: two element types in a few TUs instantiate
  # less than the 10-type libraries of instantiations/ would compile
  opts=(--buildtype=debug -Doptimization=1 -Db_sanitize=thread -Db_lundef=false -Dextern_templates=false
        "-Dcpp_args=-gline-tables-only -DDPKIT_TEST_TYPES_THREADS"
        -Dcuda=disabled -Dbenchmarks=disabled -Dexamples=disabled -Dtorch=disabled)
  # tests/tsan.supp: libstdc++'s reference counts of exceptions handed
  # between threads, which TSan cannot see (the file says why)
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp"
  # world sizes up to 8 threads (3 for the real models in the fusion
  # reducer test): every path and interleaving, without the 9-16-thread
  # worlds that release and ASan run (tests/test_sizes.hpp)
  export DPKIT_TEST_QUICK=1
  # inproc ranks are threads: every collective suite and the fusion reducer
  # (its communication thread); the MPI suites are left to ASan (Open MPI's
  # own shared-memory transport is not TSan-clean). collectives_large runs
  # the same code paths as collectives_allreduce/pipeline with >= 1M-element
  # buffers: 3 minutes under TSan for no thread interleaving the others lack,
  # so it is left to the release and ASan runs.
  suites=(--suite collectives --suite fusion --no-suite mpi)
  tsan_skip=collectives_large
  targets=()
elif [ "${1:-}" = "--sanitize" ]; then
  builddir=build-asan
  # clang-14, as the TSan and fuzzing builds: it compiles the sanitized
  # tests 2.5x faster than GCC 12 (44 vs 122 s for test_allreduce.cpp), which
  # keeps CI inside its budget; the release build stays GCC's, so both
  # compilers see every test
  export CC=clang-14 CXX=clang++-14
  # Only the test suite is checked under the sanitizers: no benchmarks,
  # examples or nvcc objects (GPU tests skip without a device anyway), -O1.
  # -DDPKIT_TEST_TYPES_BY_SIZE: the typed collective tests run one element type
  # of each size, 1-8 bytes (tests/collectives/common.hpp; the release build runs
  # all ten); -gline-tables-only: file and line in every report, 8% less
  # compile time than full debug information
  opts=(--buildtype=debug -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false
        "-Dcpp_args=-gline-tables-only -DDPKIT_TEST_TYPES_BY_SIZE"
        -Dcuda=disabled -Dbenchmarks=disabled -Dexamples=disabled -Dtorch=disabled)
  export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
if [ -d "$builddir/meson-info" ]; then
  # the buildtype on its own, first: given in one call with -Doptimization=1,
  # meson configure applies the debug buildtype's -O0 last (Meson 1.0; meson
  # setup does not), and the sanitizer suites ran 5-11x slower
  meson configure "$builddir" "${opts[0]}" >/dev/null
  meson configure "$builddir" "${opts[@]:1}" >/dev/null
else
  meson setup "$builddir" "${opts[@]}"
fi
want_opt=3
[ "$builddir" = build ] || want_opt=1
got_opt=$(meson introspect "$builddir" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "optimization"))')
if [ "$got_opt" != "$want_opt" ]; then
  echo "test.sh: $builddir is configured at -O$got_opt, not -O$want_opt (meson configure)" >&2
  exit 1
fi
if [ ${#suites[@]} -gt 0 ]; then
  # only what the chosen suites run, less tsan_skip: the tests by name
  mapfile -t chosen < <(meson introspect "$builddir" --tests | python3 -c '
import json, sys
want = {"collectives", "fusion"}
skip = set(sys.argv[1].split())
for t in json.load(sys.stdin):
    if set(t["suite"]) & {"dpkit:" + w for w in want} and not any(x.endswith(":mpi") for x in t["suite"]) \
       and t["name"] not in skip:
        print(t["name"], t["cmd"][0])' "${tsan_skip:-}")
  names=()
  for line in "${chosen[@]}"; do
    names+=("${line%% *}")
    targets+=("${line#* }")
  done
  ninja -C "$builddir" "${targets[@]#$PWD/$builddir/}"
  meson test -C "$builddir" --print-errorlogs --num-processes 2 "${names[@]}"
  exit 0
fi
pybuild=
if [ "$builddir" = build ]; then
  # the Python package's build (pip install .: one libtorch translation unit
  # of 2-3 minutes) runs beside the release build, on the cores the build's
  # last jobs leave idle; its tests run after the suites
  mkdir -p build-python
  scripts/python_test.sh --install-only > build-python/install.log 2>&1 &
  pybuild=$!
fi
ninja -C "$builddir"
if [ -n "$pybuild" ] && ! wait "$pybuild"; then
  cat build-python/install.log >&2
  echo "test.sh: the Python package did not build (build-python/install.log)" >&2
  exit 1
fi
meson test -C "$builddir" --print-errorlogs --num-processes 2 "${suites[@]}"
if [ "$builddir" = build ]; then
  # the Python package's tests: pytest, torch's suite (docs/python.md)
  scripts/python_test.sh --no-install
fi
