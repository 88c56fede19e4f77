#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ with clang++-14
# (-fsanitize=fuzzer,address,undefined) and runs each for SECONDS (default 60)
# over a copy of its committed seed corpus (tests/fuzz/corpus/<harness>/).
# Fails (non-zero) on any crash, sanitizer report, leak or uncaught exception;
# the reproducer is kept in the work directory named at the end.
#
#   scripts/fuzz.sh [SECONDS]        # from the repository root
#
# Needs Debian's clang-14 and libclang-rt-14-dev (the libFuzzer runtime) and
# libsimdjson-dev. Environment: CXX (default clang++-14), FUZZ_WORKDIR
# (default a fresh mktemp -d), FUZZ_JOBS (parallel fuzzing jobs per harness,
# default 1). The harnesses build and run at the same time, each on a core of
# its own (libFuzzer runs one job on one thread), their output in
# <work>/<harness>.log, printed as each ends; SECONDS is still per harness.
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cxx=${CXX:-clang++-14}
work=${FUZZ_WORKDIR:-$(mktemp -d /tmp/dpkit-fuzz.XXXXXX)}
jobs=${FUZZ_JOBS:-1}
mkdir -p "$work"

command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
simdjson_flags=$(pkg-config --cflags --libs simdjson 2>/dev/null || echo -lsimdjson)

# fuzz_one HARNESS: build it, fuzz it for SECONDS; non-zero on a finding
fuzz_one() {
  local harness=$1
  local exe="$work/$harness"
  echo "== building $harness"
  # shellcheck disable=SC2086
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$root/include" "$root/tests/fuzz/$harness.cpp" -o "$exe" $simdjson_flags -pthread
  corpus="$work/corpus-$harness"
  rm -rf "$corpus"
  cp -r "$root/tests/fuzz/corpus/$harness" "$corpus"
  # scratch files (the fuzzed source/index) on tmpfs where there is one: the
  # builder fsyncs every index, which is free there and slow on a disk
  scratch="$work/tmp-$harness"
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then scratch=$(mktemp -d /dev/shm/dpkit-fuzz.XXXXXX); fi
  mkdir -p "$scratch"
  parallel=()
  if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
  echo "== fuzzing $harness for ${seconds}s (corpus copy: $corpus)"
  failed=0
  (cd "$work" && DPKIT_TEST_TMPDIR="$scratch" UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$exe" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -max_len=8192 \
      ${parallel[@]+"${parallel[@]}"} -artifact_prefix="$work/$harness-" "$corpus" 2>&1 | tail -n 40) || failed=1
  rm -rf "$scratch"
  if compgen -G "$work/$harness-*" >/dev/null; then failed=1; fi # crash-, leak-, timeout-, oom- reproducers
  if [ $failed -ne 0 ]; then
    echo "fuzz.sh: $harness FAILED; reproducers: $(ls "$work"/$harness-* 2>/dev/null || echo none)" >&2
    return 1
  else
    echo "== $harness: no finding in ${seconds}s"
  fi
}

harnesses=(fuzz_index_file fuzz_jsonl_content)
pids=()
for harness in "${harnesses[@]}"; do
  fuzz_one "$harness" > "$work/$harness.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!harnesses[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$work/${harnesses[$i]}.log"
done
exit $status
