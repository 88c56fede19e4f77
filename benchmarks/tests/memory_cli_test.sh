#!/usr/bin/env bash
# allreduce_perf --memory symmetric|registered on two ranks of one node: the
# header says which memory the buffers are in, the rows have no wrong
# value, and where the ranks cannot share the buffers (DPKIT_SHM_BYTES=0: no
# segment) the header says "NOT shared" rather than timing the two-shot
# under the name of the memory that was asked for.
#   memory_cli_test.sh MPIEXEC ALLREDUCE_PERF
set -euo pipefail
mpiexec=$1
perf=$2
fail() { echo "memory_cli_test: $*" >&2; exit 1; }
for mem in symmetric registered; do
  out=$("$mpiexec" -n 2 "$perf" -b 1M -e 2M -f 2 -n 2 -w 1 --memory "$mem" 2>&1) || { echo "$out"; fail "--memory $mem failed"; }
  echo "$out" | grep -q "^# Memory: $mem " || { echo "$out"; fail "--memory $mem: no '# Memory: $mem' line"; }
  echo "$out" | grep -q "NOT shared" && { echo "$out"; fail "--memory $mem on one node: says NOT shared"; }
  rows=$(echo "$out" | grep -cE '^ +(1048576|2097152) ')
  [ "$rows" = 2 ] || { echo "$out"; fail "--memory $mem: $rows rows, expected 2"; }
  # #wrong, out of place and in place
  echo "$out" | grep -E '^ +(1048576|2097152) ' | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' ||
    { echo "$out"; fail "--memory $mem: wrong values"; }
  out=$(DPKIT_SHM_BYTES=0 "$mpiexec" -x DPKIT_SHM_BYTES -n 2 "$perf" -b 1M -e 1M -n 2 -w 1 --memory "$mem" 2>&1) ||
    { echo "$out"; fail "--memory $mem with DPKIT_SHM_BYTES=0 failed"; }
  echo "$out" | grep -q "^# Memory: NOT shared by the ranks" ||
    { echo "$out"; fail "--memory $mem with DPKIT_SHM_BYTES=0: the header does not say NOT shared"; }
done
echo "memory_cli_test: ok"
