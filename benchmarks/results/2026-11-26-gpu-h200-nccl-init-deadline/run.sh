#!/bin/bash
# device check: the NCCL transport's non-blocking init (deadline) on one GPU
set -x
nvidia-smi -L
NCCL_DIR=$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null)
[ -d "$NCCL_DIR/include" ] || NCCL_DIR=$(python3 -c "import nvidia.nccl,os;print(list(nvidia.nccl.__path__)[0])")
ls "$NCCL_DIR/include" "$NCCL_DIR/lib"
grep -m3 "define NCCL_MAJOR\|define NCCL_MINOR\|define NCCL_PATCH" "$NCCL_DIR/include/nccl.h"
nvcc --version | tail -2
t0=$(date +%s)
nvcc -std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 -Iinclude -I.gpu-carry -I"$NCCL_DIR/include" -DDPKIT_WITH_CUDA=1 \
  tests/gpu/test_nccl.cu tests/gpu/gpu_main.cpp -L"$NCCL_DIR/lib" -l:libnccl.so.2 -o /tmp/test_nccl || exit 3
echo "build $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH="$NCCL_DIR/lib:$LD_LIBRARY_PATH"
for i in 1 2; do
  timeout 240 /tmp/test_nccl -ni 2>&1 | tail -40
  echo "run $i rc=${PIPESTATUS[0]}"
done
