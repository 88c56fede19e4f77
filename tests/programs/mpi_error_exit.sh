#!/bin/sh
# An error on a rank of an mpirun job ends the job with the program's name,
# the rank and the message on stderr, and a non-zero status (never a hang):
# ddp_step (an MPI program, every rank fails) and jsonl_loader (no MPI: the
# rank comes from the launcher), each given a missing file from a directory
# without the repository's data. Every run is bounded by `timeout`.
# Usage: mpi_error_exit.sh MPIEXEC DDP_STEP JSONL_LOADER WORKDIR
set -u
mpiexec=$1 ddp_step=$2 jsonl_loader=$3
dir=$4/mpi-error-exit
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
fail=0
# expect_error PATTERN COMMAND...: COMMAND fails (not by timeout) within 60 s
# with PATTERN (grep -E) on stderr
expect_error() {
  pattern=$1
  shift
  timeout 60 "$@" > out 2> err
  rc=$?
  if [ $rc -eq 124 ]; then
    echo "FAIL: $* still running after 60 s"; fail=1
  elif [ $rc -eq 0 ]; then
    echo "FAIL: $* succeeded"; fail=1
  fi
  grep -Eq "$pattern" err || { echo "FAIL: $*: no '$pattern' on stderr:"; cat err; fail=1; }
}
expect_error "^ddp_step: rank [01]: .*missing\.tsv" "$mpiexec" -np 2 "$ddp_step" missing.tsv
expect_error "^jsonl_loader: rank [01]: mapped_file: cannot open 'missing\.jsonl'" \
  "$mpiexec" -np 2 "$jsonl_loader" missing.jsonl 2 0
# a plain run has no rank to name
expect_error "^jsonl_loader: mapped_file: cannot open 'missing\.jsonl'" "$jsonl_loader" missing.jsonl
cd / && rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: errors end the job with program, rank and message"
exit $fail
