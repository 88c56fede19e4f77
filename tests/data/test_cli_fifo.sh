#!/bin/sh
# dpkit-jsonl get|stats|verify|index refuses a FIFO as FILE or as the index to
# read (--index, or the default FILE.idx) at once, with exit status 1 and a
# message naming it, instead of waiting forever in open(2) for a writer. Each
# run is bounded by `timeout`, so a regression fails instead of hanging.
# Usage: test_cli_fifo.sh DPKIT_JSONL TMPDIR
set -u
tool=$1
dir=$2/cli-fifo
rm -rf "$dir" && mkdir -p "$dir" || exit 1
printf '{"a": 1}\n{"a": 2}\n' > "$dir/src.jsonl"
"$tool" index "$dir/src.jsonl" > /dev/null || { echo "FAIL: cannot index a regular file"; exit 1; }
mkfifo "$dir/fifo.jsonl" "$dir/fifo.idx" "$dir/other.jsonl.idx" || exit 1
printf '{"a": 3}\n' > "$dir/other.jsonl" # its default index other.jsonl.idx is a FIFO
fail=0
# expect_refused FIFO ARGS...: dpkit-jsonl ARGS must fail within 10 s naming FIFO
expect_refused() {
  fifo=$1
  shift
  timeout 10 "$tool" "$@" > "$dir/out" 2>&1
  rc=$?
  if [ $rc -eq 124 ]; then
    echo "FAIL: dpkit-jsonl $* still blocked after 10 s"; fail=1; return
  fi
  [ $rc -eq 1 ] || { echo "FAIL: dpkit-jsonl $*: exit status $rc, expected 1"; fail=1; }
  grep -q "'$fifo' is a FIFO, not a regular file" "$dir/out" ||
    { echo "FAIL: dpkit-jsonl $*: no message naming $fifo:"; cat "$dir/out"; fail=1; }
}
# the FIFO as FILE (the source), its index regular
expect_refused "$dir/fifo.jsonl" get "$dir/fifo.jsonl" 0 --index "$dir/src.jsonl.idx"
expect_refused "$dir/fifo.jsonl" stats "$dir/fifo.jsonl" --index "$dir/src.jsonl.idx"
expect_refused "$dir/fifo.jsonl" verify "$dir/fifo.jsonl" --index "$dir/src.jsonl.idx"
expect_refused "$dir/fifo.jsonl" index "$dir/fifo.jsonl" --index "$dir/new.idx"
# the FIFO as the index to read, given or by default
expect_refused "$dir/fifo.idx" get "$dir/src.jsonl" 0 --index "$dir/fifo.idx"
expect_refused "$dir/fifo.idx" stats "$dir/src.jsonl" --index "$dir/fifo.idx"
expect_refused "$dir/fifo.idx" verify "$dir/src.jsonl" --index "$dir/fifo.idx"
expect_refused "$dir/other.jsonl.idx" get "$dir/other.jsonl" 0
expect_refused "$dir/other.jsonl.idx" stats "$dir/other.jsonl"
expect_refused "$dir/other.jsonl.idx" verify "$dir/other.jsonl"
[ -e "$dir/new.idx" ] && { echo "FAIL: an index was written for a FIFO source"; fail=1; }
[ -p "$dir/fifo.idx" ] && [ -p "$dir/other.jsonl.idx" ] || { echo "FAIL: a FIFO index was replaced"; fail=1; }
# a regular file still works
[ "$("$tool" get "$dir/src.jsonl" 1)" = '{"a": 2}' ] || { echo "FAIL: get on a regular file"; fail=1; }
rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: FIFO sources and indexes refused at once by get, stats, verify and index"
exit $fail
