#!/bin/bash
# the never-joining-rank test against the header before the fix (expect a hang, killed at 25 s)
NCCL_DIR=$(python3 -c "import nvidia.nccl,os;print(list(nvidia.nccl.__path__)[0])")
export LD_LIBRARY_PATH="$NCCL_DIR/lib:$LD_LIBRARY_PATH"
build() { nvcc -std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 -I$1 -I.gpu-carry -I"$NCCL_DIR/include" -DDPKIT_WITH_CUDA=1 \
  tests/gpu/test_nccl.cu tests/gpu/gpu_main.cpp -L"$NCCL_DIR/lib" -l:libnccl.so.2 -o $2; }
build .gpu-carry/oldinc /tmp/test_old & build include /tmp/test_new & wait
echo "== before the fix (header of HEAD), timeout 25 s:"
t0=$(date +%s.%N); timeout 25 /tmp/test_old -ni -tc="*never joins*" 2>&1 | tail -5; echo "rc=${PIPESTATUS[0]} after $(echo "$(date +%s.%N) - $t0" | bc) s"
echo "== after the fix:"
timeout 60 /tmp/test_new -ni -tc="*never joins*" 2>&1 | tail -8; echo "rc=${PIPESTATUS[0]}"
