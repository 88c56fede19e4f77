# The device run of 2026-12-04 (second): the device check, then the native
# all-reduce's wait before (ea1db20, build-device/old) and after, alternated.
set -u
out=${OUT:-/tmp/abtest}; mkdir -p "$out"
(nvidia-smi; nproc; g++ --version | head -1) > "$out/machine.txt" 2>&1
scripts/device_check.sh --budget 400 --out /tmp/dc > /tmp/dc_console.log 2>&1; rc=$?
cp /tmp/dc_console.log "$out/console.log"; cp /tmp/dc/summary.md "$out/" 2>/dev/null
L=$(sed -n 's/^NCCL: .* lib \(.*\))$/\1/p' /tmp/dc/env.txt)
new=$(cat /tmp/dc/build/allreduce_device_perf.bin)
{ echo "nccl lib: $L"
  for i in 1 2 3; do for v in old new; do
    b=build-device/old/allreduce_device_perf; [ $v = new ] && b=$new
    echo "== round $i: $v ($b)"
    LD_LIBRARY_PATH=$L timeout 60 "$b" -b 8 -e 1G -f 2 -n 20 -w 5 -r 2; echo "rc=$?"
  done; done; } > /tmp/dc/native_ab.log 2>&1
tar czf "$out/device_check.tgz" -C /tmp dc
echo "device_check rc=$rc"; cat /tmp/dc/summary.md; grep -E "^== |key:" /tmp/dc/native_ab.log
