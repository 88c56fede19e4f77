#!/bin/sh
# dpkit-jsonl index --index refuses an existing target that is not a regular
# file (a FIFO, a symlink to it, /dev/null) with exit status 1 and a message,
# and leaves it exactly as it was. Usage: test_cli_index_target.sh DPKIT_JSONL TMPDIR
set -u
tool=$1
dir=$2/cli-index-target
rm -rf "$dir" && mkdir -p "$dir" || exit 1
printf '{"a": 1}\n{"a": 2}\n' > "$dir/src.jsonl"
mkfifo "$dir/fifo.idx" || exit 1
ln -s "$dir/fifo.idx" "$dir/link.idx"
fail=0
for target in "$dir/fifo.idx" "$dir/link.idx" /dev/null; do
  before=$(stat -c '%F %t:%T %i' "$target")
  if "$tool" index "$dir/src.jsonl" --index "$target" >"$dir/out" 2>&1; then
    echo "FAIL: dpkit-jsonl index --index $target succeeded"; fail=1
  fi
  grep -q "not a regular file" "$dir/out" || { echo "FAIL: no message for $target:"; cat "$dir/out"; fail=1; }
  after=$(stat -c '%F %t:%T %i' "$target")
  [ "$before" = "$after" ] || { echo "FAIL: $target changed: '$before' -> '$after'"; fail=1; }
  ls "$(dirname "$target")" | grep -q "$(basename "$target").tmp" && { echo "FAIL: temporary left next to $target"; fail=1; }
done
"$tool" index "$dir/src.jsonl" --index "$dir/regular.idx" >/dev/null || { echo "FAIL: regular target"; fail=1; }
rm -rf "$dir"
[ $fail -eq 0 ] && echo "OK: FIFO, symlink to FIFO and /dev/null refused and untouched"
exit $fail
