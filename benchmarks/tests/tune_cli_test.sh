#!/usr/bin/env bash
# allreduce_perf's tuner from the command line, on one host divided into two
# virtual nodes of two ranks (DPKIT_RANKS_PER_NODE=2): --tune=FILE writes a
# tuning file with rules for the 4-rank, 2-node shape and both links;
# --explain reads it back through DPKIT_TUNING_FILE and names the rule;
# --predict prints the cost model's table from its links, and refuses a file
# without them; --tune does not write over a file that is not a tuning file.
#   tune_cli_test.sh MPIEXEC ALLREDUCE_PERF
set -euo pipefail
mpiexec=$1
perf=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "tune_cli_test: $*" >&2; exit 1; }
run4() { DPKIT_RANKS_PER_NODE=2 "$mpiexec" -n 4 --oversubscribe -x DPKIT_RANKS_PER_NODE -x DPKIT_TUNING_FILE "$@"; }

export DPKIT_TUNING_FILE=
f=$work/tuning.txt
run4 "$perf" --tune="$f" -b 8 -e 64K -f 16 -n 2 -w 1 >"$work/tune.log" 2>&1 || { cat "$work/tune.log"; fail "--tune failed"; }
[ -f "$f" ] || fail "--tune=$f wrote nothing"
[ "$(head -c 14 "$f")" = "dpkit-tuning 1" ] || fail "$f does not start with 'dpkit-tuning 1'"
# sizes 8, 128, 2K, 32K: one rule each for 4 ranks on 2 nodes of 2
[ "$(grep -c '^allreduce 4 2 2 ' "$f")" = 4 ] || { cat "$f"; fail "expected 4 rules 'allreduce 4 2 2 ...'"; }
grep -q '^link intra ' "$f" || fail "no 'link intra' line"
grep -q '^link inter ' "$f" || fail "no 'link inter' line"
ls "$work" | grep -q '\.tmp\.' && fail "a temporary file was left beside $f"

# --explain names the file's rule for 8 bytes (the first rule: from 0)
export DPKIT_TUNING_FILE=$f
out=$(run4 "$perf" --explain 8 2>&1) || { echo "$out"; fail "--explain failed"; }
echo "$out" | grep -q "by rule 'allreduce 4 2 2 0 " || { echo "$out"; fail "--explain 8 does not name the file's first rule"; }
echo "$out" | grep -q "$f" || { echo "$out"; fail "--explain does not name $f"; }

# --predict: one row per size, 8 B .. 512 KiB by 4 (9 rows; -e 1M), and a best column
out=$("$perf" --predict 64x8 -b 8 -e 1M -f 4 2>&1) || { echo "$out"; fail "--predict 64x8 failed"; }
rows=$(echo "$out" | grep -cE '^ +[0-9]+ ')
[ "$rows" = 9 ] || { echo "$out"; fail "--predict 64x8 printed $rows rows, expected 9"; }
echo "$out" | grep -qE "^ +524288 .* (ring|tree|hier)$" || { echo "$out"; fail "--predict: no best algorithm at 512 KiB"; }

# a table without link lines: --predict refuses (names what is missing)
grep -v '^link ' "$f" >"$work/nolinks.txt"
if DPKIT_TUNING_FILE=$work/nolinks.txt "$perf" --predict 2x2 >"$work/p.log" 2>&1; then fail "--predict without link lines succeeded"; fi
grep -q "link intra" "$work/p.log" || { cat "$work/p.log"; fail "--predict's error does not name the missing lines"; }

# --tune does not write over a file that is not a tuning file
echo "precious" >"$work/notes.txt"
export DPKIT_TUNING_FILE=
if run4 "$perf" --tune="$work/notes.txt" -b 8 -e 8 -n 1 -w 0 >"$work/t2.log" 2>&1; then fail "--tune wrote over a file that is not a tuning file"; fi
[ "$(cat "$work/notes.txt")" = precious ] || fail "notes.txt was changed"
echo "tune_cli_test: ok"
