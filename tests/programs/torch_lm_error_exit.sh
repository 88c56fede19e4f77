#!/bin/sh
# torch_lm under mpirun from a directory without the repository's data:
# 1. a missing --corpus (with the right --spm: every rank loads it first),
#    which only rank 0 opens while rank 1 waits in a barrier, ends the job with "torch_lm: rank 0: mapped_file:
#    cannot open ..." at once and a non-zero status (it hung, silently: rank 0
#    unwound through the communicator's collective free);
# 2. without --corpus and --spm, the repository's corpus and model are found
#    (next to the executable's build directory, or the directories baked in
#    at build time) and one step trains.
# Every run is bounded by `timeout`, so a hang fails instead of blocking.
# Usage: torch_lm_error_exit.sh MPIEXEC TORCH_LM SOURCE_ROOT WORKDIR
set -u
mpiexec=$1 torch_lm=$2 spm=$3/data/debian-bpe-8k.model
dir=$4/torch-lm-error-exit
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
fail=0
timeout 60 "$mpiexec" -np 2 "$torch_lm" --steps 2 --corpus missing.jsonl --spm "$spm" > out 2> err
rc=$?
if [ $rc -eq 124 ]; then
  echo "FAIL: a missing --corpus hung the job (still running after 60 s)"; fail=1
elif [ $rc -eq 0 ]; then
  echo "FAIL: a missing --corpus succeeded"; fail=1
fi
grep -q "^torch_lm: rank 0: mapped_file: cannot open 'missing.jsonl'" err ||
  { echo "FAIL: no message for the missing corpus:"; cat out err; fail=1; }
timeout 300 "$mpiexec" -np 2 "$torch_lm" --steps 1 --layers 1 --d-model 32 --heads 2 --max-tokens 256 > out 2> err
rc=$?
if [ $rc -ne 0 ] || ! grep -q "2 ranks" out; then
  echo "FAIL: the default corpus and model were not found from $dir (status $rc):"; cat out err; fail=1
fi
cd / && rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: a rank's error ends the job at once; the defaults are found from another directory"
exit $fail
