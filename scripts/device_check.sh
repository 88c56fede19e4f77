#!/usr/bin/env bash
# Every GPU check of dpkit in one call, for a lent GPU machine (one H100 or
# H200, CUDA and a compiler, NCCL from its Python's nvidia wheel, no MPI, no
# meson, no network): builds with nvcc and g++ directly, runs each check
# under its own timeout, and writes one log per step and $OUT/summary.md
# (step, status, seconds, key figure). docs/gpu.md "The device check".
#
#   scripts/device_check.sh                # build (or reuse prebuilt binaries) and run every step
#   scripts/device_check.sh --prepare      # on a CPU machine: fill build-device/ (headers and libraries
#                                          # the device lacks + the CUDA binaries, prebuilt), then carry it
#   scripts/device_check.sh --build-only   # build, run nothing
#   scripts/device_check.sh --dry-run      # build, then run every step with no device visible
#                                          # (CUDA_VISIBLE_DEVICES=''): each must exit 77
#   options: --out DIR (default $OUT, else a new /tmp dir)  --build DIR (default $DPKIT_DEVICE_BUILD,
#            else /tmp/dpkit-device-build)  --carry DIR (default build-device)  --budget SECONDS (480)
#            --jobs N (nproc)  --only step,step  --no-prebuilt  --cuda-only (no torch program)
#
# Steps, in order (each a row of the summary):
#   gpu_nccl            tests/gpu/test_nccl.cu: the NCCL transport on one rank (doctest)
#   allreduce_perf      benchmarks/allreduce_device_perf.cu: device buffers, 8 B - 1 GiB, ncclAllReduce
#                       next to dpkit's native call, ring over NCCL (1 rank), ring over inproc (2 ranks, one GPU)
#   fusion_perf         benchmarks/fusion_device_perf.cu: GPT-2's 148 gradients on the GPU: per-tensor,
#                       flat, bucketed on the device, host-staged gradient_reducer; 1 rank (NCCL) and 2 (inproc)
#   ddp_two_procs       tests/gpu/torch_ddp_cuda.cpp: 2 processes on the one GPU launched through a tcp://
#                       store (no mpirun), dpkit's DDP on CUDA tensors (host-staged), 20 SGD steps; the same
#                       on the CPU; per-step losses and gradient norms must agree within 1e-3 (relative) and the ranks' parameters
#                       be bitwise equal
#   torch_lm_overhead   the same program on one GPU, 50 steps: libtorch's own step against dpkit's DDP
#                       (world size 1; pinned host buckets, its default, and pageable ones) for torch_lm's
#                       model (2 x 128) and a larger one (6 x 512)
#   gpu_kernels         tests/gpu/test_kernels.cu: every op x type x length, bitwise against the host
#   gpu_inproc_device   tests/gpu/test_inproc_device.cu: ring/tree/... on 2-8 ranks on one GPU
# The torch steps need a Python whose torch has CUDA (found without importing
# it; DPKIT_PYTHON or DPKIT_TORCH_DIR to choose) and Gloo (carried from
# build-device/ or the system); without them they are NOT-RUN, with the reason.
#
# Exit status: 0 every step passed (NOT-RUN rows allowed: they name what is
# missing); 1 a build or a step failed; 77 no CUDA device was found (after
# building everything and running every step to its 'no device' exit);
# 2 usage. DPKIT_DEVICE_CHECK_AS_CPU=1 runs the torch steps' GPU half on the
# CPU: a test of this script itself on a machine without a GPU.
set -u
cd "$(dirname "$0")/.." || exit 2
root=$PWD
t_start=$(date +%s)

mode=run
dry_run=0
prebuilt=1
out=${OUT:-}
build=${DPKIT_DEVICE_BUILD:-/tmp/dpkit-device-build}
carry=${DPKIT_DEVICE_CARRY:-build-device}
budget=${DPKIT_DEVICE_BUDGET:-480}
jobs_n=${DPKIT_DEVICE_JOBS:-$(nproc 2>/dev/null || echo 4)}
only=""
cuda_home=${CUDA_HOME:-/usr/local/cuda}
# SASS for sm_90 (H100, H200) and compute_90 PTX (JIT-compiled on newer GPUs)
arch=${DPKIT_CUDA_ARCH:-"-gencode=arch=compute_90,code=[sm_90,compute_90]"}
build_timeout=${DPKIT_DEVICE_BUILD_TIMEOUT:-}
cuda_only=0

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) mode=prepare ;;
    --build-only) mode=build ;;
    --dry-run) dry_run=1 ;;
    --no-prebuilt) prebuilt=0 ;;
    --cuda-only) cuda_only=1 ;;
    --out) out=$2; shift ;;
    --build) build=$2; shift ;;
    --carry) carry=$2; shift ;;
    --budget) budget=$2; shift ;;
    --jobs) jobs_n=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) usage ;;
    *) echo "device_check: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[ -n "$out" ] || out=$(mktemp -d /tmp/dpkit-device-check.XXXXXX)
case $carry in /*) ;; *) carry=$root/$carry ;; esac
case $build in /*) ;; *) build=$root/$build ;; esac
case $out in /*) ;; *) out=$root/$out ;; esac
[ "$mode" = prepare ] && build=$carry/bin
mkdir -p "$out/build" "$build" || exit 2
rm -f "$out"/build/*.rc "$out"/build/*.bin # a reused --out: no stale build results
if [ "$dry_run" = 1 ]; then export CUDA_VISIBLE_DEVICES=; fi
# a build never outlasts the budget (on the lent machine compile time is device time)
[ -n "$build_timeout" ] || build_timeout=$(( budget < 900 ? budget : 900 ))
read -ra arch_flags <<< "$arch"

log() { echo "== [$(( $(date +%s) - t_start )) s] $*"; }
elapsed() { echo $(( $(date +%s) - t_start )); }
remaining() { echo $(( budget - $(elapsed) )); }

# ---------------------------------------------------------------- environment
nvcc=$cuda_home/bin/nvcc
[ -x "$nvcc" ] || nvcc=$(command -v nvcc || true)
cxx=${CXX:-g++}

# python3 candidates: DPKIT_PYTHON, python3 on PATH, the lent machines' venv, the system's
pythons=()
for p in "${DPKIT_PYTHON:-}" "$(command -v python3 || true)" /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  [ -n "$p" ] && [ -x "$p" ] && pythons+=("$p")
done
# A module's directory without importing it (importing torch costs seconds).
py_module_dir() { # PYTHON MODULE
  "$1" -c "import importlib.util as u,sys
try:
    s=u.find_spec(sys.argv[1])
except Exception:
    s=None
print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')" "$2" 2>/dev/null
}

# NCCL: DPKIT_NCCL_DIR, the CUDA toolkit, python3's nvidia-nccl wheel, the system
nccl_inc="" nccl_lib=""
nccl_try() { # INCDIR LIBDIR...
  local inc=$1; shift
  [ -f "$inc/nccl.h" ] || return 1
  for l in "$@"; do
    if [ -e "$l/libnccl.so.2" ]; then nccl_inc=$inc nccl_lib=$l; return 0; fi
  done
  return 1
}
if [ -n "${DPKIT_NCCL_DIR:-}" ]; then nccl_try "$DPKIT_NCCL_DIR/include" "$DPKIT_NCCL_DIR/lib" "$DPKIT_NCCL_DIR/lib64"; fi
[ -n "$nccl_inc" ] || nccl_try "$cuda_home/include" "$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib"
if [ -z "$nccl_inc" ]; then
  for p in "${pythons[@]}"; do
    d=$(py_module_dir "$p" nvidia.nccl)
    if [ -n "$d" ] && nccl_try "$d/include" "$d/lib"; then break; fi
  done
fi
[ -n "$nccl_inc" ] || nccl_try /usr/include /usr/lib/x86_64-linux-gnu
nccl_version=""
if [ -n "$nccl_inc" ]; then
  nccl_version=$(awk '/#define NCCL_MAJOR/{a=$3}/#define NCCL_MINOR/{b=$3}/#define NCCL_PATCH/{c=$3}END{print a"."b"."c}' "$nccl_inc/nccl.h")
fi

# Headers and libraries a lent machine lacks: from the carry dir, else the system
doctest_inc=""
if [ -f "$carry/include/doctest/doctest.h" ]; then doctest_inc=$carry/include
elif [ -f /usr/include/doctest/doctest.h ]; then doctest_inc=/usr/include; fi
gloo_inc="" gloo_libdir="" gloo_note=""
if [ -f "$carry/include/gloo/config.h" ] && [ -e "$carry/lib/libgloo.so.0" ] && [ -f "$carry/include/hiredis/hiredis.h" ]; then
  gloo_inc=$carry/include gloo_libdir=$carry/lib gloo_note="carried ($carry)"
elif [ -f /usr/include/gloo/config.h ] && [ -f /usr/include/hiredis/hiredis.h ]; then
  for d in /usr/lib /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    if [ -e "$d/libgloo.so.0" ]; then gloo_inc=/usr/include gloo_libdir=$d gloo_note="system ($d)"; break; fi
  done
fi
hiredis_lib=""
if [ -n "$gloo_libdir" ]; then
  for d in "$gloo_libdir" /usr/lib/x86_64-linux-gnu /usr/lib; do
    f=$(ls "$d"/libhiredis.so.* 2>/dev/null | head -1)
    if [ -n "$f" ]; then hiredis_lib=$f; break; fi
  done
fi

# torch: a wheel layout (include/, lib/) with libtorch_cuda; DPKIT_TORCH_DIR or a python's torch
torch_dir="" torch_note="no Python with torch found"
torch_candidates=()
[ -n "${DPKIT_TORCH_DIR:-}" ] && torch_candidates+=("$DPKIT_TORCH_DIR")
for p in "${pythons[@]}"; do
  d=$(py_module_dir "$p" torch)
  [ -n "$d" ] && torch_candidates+=("$d")
done
for d in "${torch_candidates[@]}"; do
  if [ ! -d "$d/include/torch/csrc/api/include" ] || [ ! -d "$d/lib" ]; then
    torch_note="torch at $d has no C++ headers (include/torch/csrc/api/include)"; continue
  fi
  if [ ! -e "$d/lib/libtorch_cuda.so" ]; then torch_note="torch at $d is built without CUDA (no lib/libtorch_cuda.so)"; continue; fi
  torch_dir=$d; break
done
torch_version="" torch_abi=1
if [ -n "$torch_dir" ]; then
  torch_version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$torch_dir/version.py" 2>/dev/null)
  # wheels before torch 2.7 used the pre-C++11 string ABI (TorchConfig.cmake says so); Gloo's is C++11
  abi=$(grep -o '_GLIBCXX_USE_CXX11_ABI=[01]' "$torch_dir/share/cmake/Torch/TorchConfig.cmake" 2>/dev/null | head -1)
  [ -n "$abi" ] && torch_abi=${abi##*=}
  torch_note="torch $torch_version at $torch_dir"
  if [ "$torch_abi" != 1 ]; then
    torch_note="torch $torch_version at $torch_dir uses the pre-C++11 ABI; the carried Gloo needs the C++11 one"
    torch_dir=""
  fi
fi

# ------------------------------------------------------------------- prepare
# Copies what a lent machine lacks into the carry dir: doctest, Gloo and
# hiredis headers, libgloo and the libraries it needs beyond glibc/libstdc++.
prepare_carry() {
  mkdir -p "$carry/include" "$carry/lib" || return 1
  local ok=0
  for h in doctest gloo hiredis; do
    if [ -d "/usr/include/$h" ]; then cp -r "/usr/include/$h" "$carry/include/"; else echo "prepare: /usr/include/$h missing"; ok=1; fi
  done
  local g=""
  for d in /usr/lib /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    [ -e "$d/libgloo.so.0" ] && { g=$d/libgloo.so.0; break; }
  done
  if [ -z "$g" ]; then echo "prepare: libgloo.so.0 not found (apt-get install libgloo-dev)"; return 1; fi
  cp -L "$g" "$carry/lib/libgloo.so.0"
  # libgloo's own dependencies other than the C and C++ runtimes (hiredis, ibverbs, libnl)
  ldd "$g" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r soname path; do
    case $soname in libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*) continue ;; esac
    cp -L "$path" "$carry/lib/$soname"
  done
  return $ok
}

# --------------------------------------------------------------------- build
# One stamp per target: the sources and headers it may use, the compiler
# versions and the build recipe (not its paths), so binaries built on another machine
# with the same toolchain are reused and anything else is rebuilt.
src_hash=$( (find include examples tests/gpu benchmarks/common -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cuh' -o -name '*.cu' -o -name '*.cpp' \) | LC_ALL=C sort; \
             echo benchmarks/allreduce_device_perf.cu benchmarks/fusion_device_perf.cu) | xargs cat 2>/dev/null | sha256sum | cut -c1-16)
nvcc_version=$([ -n "$nvcc" ] && "$nvcc" --version 2>/dev/null | tail -1)
stamp_of() { # TARGET
  local extra=""
  [ "$1" = torch_ddp_cuda ] && extra="torch=$torch_version:$torch_dir gloo=$gloo_note cxx=$($cxx -dumpfullversion 2>/dev/null)"
  # the recipe: compile_cmd's text, with its variables unexpanded (flags count, paths do not)
  echo "$1|$src_hash|$nvcc_version|$arch|nccl=$nccl_version|$extra|$(declare -f compile_cmd)" | sha256sum | cut -c1-16
}

targets_cuda=(test_nccl allreduce_device_perf fusion_device_perf test_kernels test_inproc_device)
# in the order the steps need them (the torch program builds while the first GPU steps run)
targets=(test_nccl allreduce_device_perf fusion_device_perf torch_ddp_cuda test_kernels test_inproc_device)
[ "$cuda_only" = 1 ] && targets=("${targets_cuda[@]}")
if [ -n "$only" ]; then # only what the chosen steps run
  sel=()
  for t in "${targets[@]}"; do
    case $t in
      test_nccl) s=gpu_nccl ;; allreduce_device_perf) s=allreduce_perf ;; fusion_device_perf) s=fusion_perf ;;
      test_kernels) s=gpu_kernels ;; test_inproc_device) s=gpu_inproc_device ;; torch_ddp_cuda) s="ddp_two_procs torch_lm_overhead" ;;
    esac
    for x in $s; do [[ ",$only," == *",$x,"* ]] && { sel+=("$t"); break; }; done
  done
  targets=("${sel[@]}")
fi

# why TARGET cannot be built here (empty: it can)
cannot_build() {
  case $1 in
    torch_ddp_cuda)
      [ -n "$torch_dir" ] || { echo "$torch_note"; return; }
      [ -n "$gloo_inc" ] || { echo "no Gloo headers/library (carry build-device/ from scripts/device_check.sh --prepare)"; return; }
      [ -n "$hiredis_lib" ] || { echo "no libhiredis next to Gloo"; return; } ;;
    *)
      [ -n "$nvcc" ] || { echo "no nvcc (CUDA_HOME=$cuda_home)"; return; }
      case $1 in test_*) [ -n "$doctest_inc" ] || { echo "no doctest header (carry build-device/)"; return; } ;; esac
      case $1 in test_kernels|test_inproc_device) ;; *) [ -n "$nccl_inc" ] || { echo "no NCCL (nccl.h, libnccl.so.2)"; return; } ;; esac ;;
  esac
}

nvflags=(-std=c++20 -O2 "${arch_flags[@]}" -Iinclude -Iexamples -Ibenchmarks/common -DDPKIT_WITH_CUDA=1
         -DDPKIT_NO_MPI -Xcompiler=-pthread)
# compile_cmd TARGET OUTPUT: sets the array ccmd to the command that builds TARGET into OUTPUT
compile_cmd() {
  local t=$1 o=$2 inc=() nccl=() ginc=()
  [ -n "$doctest_inc" ] && [ "$doctest_inc" != /usr/include ] && inc+=(-isystem "$doctest_inc")
  [ -n "$gloo_inc" ] && [ "$gloo_inc" != /usr/include ] && ginc+=(-isystem "$gloo_inc") # never -isystem /usr/include
  [ -n "$nccl_inc" ] && nccl=(-I"$nccl_inc" -L"$nccl_lib" -l:libnccl.so.2)
  case $t in
    test_kernels|test_inproc_device)
      ccmd=("$nvcc" "${nvflags[@]}" "${inc[@]}" "tests/gpu/$t.cu" tests/gpu/gpu_main.cpp -o "$o") ;;
    test_nccl)
      ccmd=("$nvcc" "${nvflags[@]}" "${inc[@]}" tests/gpu/test_nccl.cu tests/gpu/gpu_main.cpp "${nccl[@]}" -o "$o") ;;
    allreduce_device_perf|fusion_device_perf)
      ccmd=("$nvcc" "${nvflags[@]}" "benchmarks/$t.cu" "${nccl[@]}" -o "$o") ;;
    torch_ddp_cuda)
      # Gloo before the torch libraries: the wheel's libtorch_cpu exports its own bundled Gloo,
      # and this program's Gloo calls must bind to the Gloo whose headers it was compiled with.
      # --no-as-needed keeps libtorch_cuda (nothing references it; loading it registers CUDA).
      # --disable-new-dtags: an RPATH, which also finds libgloo's own libraries (ibverbs, libnl)
      # in the carry dir; a RUNPATH serves the program's direct dependencies only.
      # --allow-shlib-undefined: the torch libraries' own dependencies (cuSPARSELt, NVSHMEM, cuFile
      # from the nvidia wheels) are the loader's business; ld need not find them to link this program.
      # shellcheck disable=SC2054 # the commas are the linker's (-Wl,...)
      ccmd=("$cxx" -std=c++20 -O2 -pthread -D_GLIBCXX_USE_CXX11_ABI="$torch_abi" -DDPKIT_NO_MPI -Iinclude -Iexamples
            "${ginc[@]}" -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include"
            tests/gpu/torch_ddp_cuda.cpp -o "$o"
            -Wl,--disable-new-dtags -Wl,--allow-shlib-undefined -L"$gloo_libdir" -Wl,-rpath,"$gloo_libdir" -Wl,-rpath-link,"$gloo_libdir"
            -l:libgloo.so.0 "$hiredis_lib"
            -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" -Wl,--no-as-needed -ltorch -ltorch_cuda -lc10_cuda
            -Wl,--as-needed -ltorch_cpu -lc10) ;;
  esac
}

# bin_of TARGET: the binary to run (set by build_one through $out/build/TARGET.bin)
bin_of() { cat "$out/build/$1.bin" 2>/dev/null; }

build_one() { # TARGET: writes $out/build/TARGET.{log,rc,bin,note,sec}
  local t=$1 st why missing
  local b=$out/build
  st=$(stamp_of "$t")
  why=$(cannot_build "$t")
  if [ -n "$why" ]; then
    echo "$why" > "$b/$t.note"; echo 0 > "$b/$t.sec"; echo 3 > "$b/$t.rc"; return
  fi
  for d in "$carry/bin" "$build"; do
    if [ "$prebuilt" = 1 ] && [ -x "$d/$t" ] && [ "$(cat "$d/$t.stamp" 2>/dev/null)" = "$st" ]; then
      # a binary from another machine must find its libraries (glibc, libstdc++, NCCL) here
      missing=$(LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$d/$t" 2>&1 | grep 'not found' | head -1)
      if [ -n "$missing" ]; then echo "prebuilt $d/$t not used: $missing" >> "$b/$t.log"; continue; fi
      echo "$d/$t" > "$b/$t.bin"; echo "reused: $d/$t (its stamp $st matches)" > "$b/$t.note"; echo 0 > "$b/$t.sec"
      echo 0 > "$b/$t.rc"; return
    fi
  done
  local o=$build/$t t0 rc ccmd=()
  t0=$(date +%s)
  compile_cmd "$t" "$o"
  printf '%q ' "${ccmd[@]}" >> "$b/$t.log"
  echo >> "$b/$t.log"
  timeout "$build_timeout" "${ccmd[@]}" >> "$b/$t.log" 2>&1
  rc=$?
  echo $(( $(date +%s) - t0 )) > "$b/$t.sec"
  if [ $rc -eq 0 ]; then
    echo "$st" > "$o.stamp"; echo "$o" > "$b/$t.bin"; echo "built" > "$b/$t.note"
  else
    rm -f "$o.stamp"; echo "build failed (exit $rc): $b/$t.log" > "$b/$t.note"
  fi
  echo $rc > "$b/$t.rc"
}

# Builds every target, at most jobs_n at a time, in the order the steps need them.
build_all() {
  for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_n" ]; do wait -n; done
    build_one "$t" &
  done
  wait
}

# wait_build TARGET: 0 when built; 1 failed; 2 cannot be built; 3 out of time
wait_build() {
  local rc
  while [ ! -f "$out/build/$1.rc" ]; do
    [ "$(remaining)" -gt 10 ] || return 3
    sleep 1
  done
  rc=$(cat "$out/build/$1.rc")
  [ "$rc" = 0 ] && return 0
  [ "$rc" = 3 ] && return 2
  return 1
}

# --------------------------------------------------------------------- steps
summary_rows=()
any_fail=0
device_found=0
add_row() { # STEP STATUS SECONDS KEY
  summary_rows+=("| $1 | $2 | $3 | ${4//|/\\|} |")
  [ "$2" = FAIL ] && any_fail=1
  log "$1: $2 ($3 s) $4"
}
want_step() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# need TARGET...: sets need_status/need_why when a target is not runnable
need() {
  need_status="" need_why=""
  for t in "$@"; do
    wait_build "$t"
    case $? in
      0) ;;
      1) need_status=FAIL need_why="$(cat "$out/build/$t.note")"; return 1 ;;
      2) need_status=NOT-RUN need_why="$t: $(cat "$out/build/$t.note")"; return 1 ;;
      3) need_status=NOT-RUN need_why="time budget spent waiting for the $t build"; return 1 ;;
    esac
  done
}

# step_timeout WANTED: the step's limit within the budget (0: no time left)
step_timeout() {
  local r
  r=$(( $(remaining) - 5 ))
  [ "$r" -lt 10 ] && { echo 0; return; }
  [ "$1" -lt "$r" ] && echo "$1" || echo "$r"
}

status_of_rc() { # RC LIMIT
  case $1 in
    0) echo PASS ;;
    77) echo "SKIP(77)" ;;
    124|137) echo FAIL ;;
    *) echo FAIL ;;
  esac
}
why_of_rc() { # RC LIMIT
  case $1 in
    0|77) echo "" ;;
    124|137) echo "timed out after $2 s" ;;
    *) echo "exit $1" ;;
  esac
}

nccl_env() { LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

# doctest's totals: "13/13 test cases, 645 assertions"
doctest_key() {
  awk '/test cases:/{tc=$0} /assertions:/{as=$0} END{
    n=split(tc,a,"|"); gsub(/[^0-9]/,"",a[1]); gsub(/[^0-9]/,"",a[2]); split(as,b,"|"); gsub(/[^0-9]/,"",b[1]); gsub(/[^0-9]/,"",b[3]);
    if (tc!="") printf "%s/%s test cases passed, %s assertions (%s failed)", a[2], a[1], b[1], b[3]}' "$1"
}

run_doctest_step() { # STEP TARGET WANTED_TIMEOUT
  local step=$1 t=$2 lim rc t0 key
  want_step "$step" || return 0
  need "$t" || { add_row "$step" "$need_status" 0 "$need_why"; return; }
  lim=$(step_timeout "$3")
  [ "$lim" -gt 0 ] || { add_row "$step" NOT-RUN 0 "time budget spent"; return; }
  t0=$(date +%s)
  nccl_env timeout -k 5 "$lim" "$(bin_of "$t")" -ni > "$out/$step.log" 2>&1
  rc=$?
  key=$(doctest_key "$out/$step.log")
  [ $rc = 77 ] && key=$(tail -1 "$out/$step.log")
  [ $rc != 0 ] && [ $rc != 77 ] && key="$(why_of_rc $rc "$lim"); $key"
  add_row "$step" "$(status_of_rc $rc)" $(( $(date +%s) - t0 )) "$key"
  [ $rc = 0 ] && device_found=1
}

run_allreduce_perf() {
  local step=allreduce_perf lim rc t0 key
  want_step $step || return 0
  need allreduce_device_perf || { add_row $step "$need_status" 0 "$need_why"; return; }
  lim=$(step_timeout 150)
  [ "$lim" -gt 0 ] || { add_row $step NOT-RUN 0 "time budget spent"; return; }
  t0=$(date +%s)
  nccl_env timeout -k 5 "$lim" "$(bin_of allreduce_device_perf)" -b 8 -e 1G -f 2 -n 20 -w 5 -r 2 > "$out/$step.log" 2>&1
  rc=$?
  key=$(sed -n 's/^# key: //p' "$out/$step.log" | tail -1)
  [ $rc = 77 ] && key=$(tail -1 "$out/$step.log")
  [ $rc != 0 ] && [ $rc != 77 ] && key="$(why_of_rc $rc "$lim"); $(tail -1 "$out/$step.log")"
  add_row $step "$(status_of_rc $rc)" $(( $(date +%s) - t0 )) "$key"
  [ $rc = 0 ] && device_found=1
}

run_fusion_perf() {
  local step=fusion_perf lim rc rc2=0 t0 key
  want_step $step || return 0
  need fusion_device_perf || { add_row $step "$need_status" 0 "$need_why"; return; }
  lim=$(step_timeout 120)
  [ "$lim" -gt 0 ] || { add_row $step NOT-RUN 0 "time budget spent"; return; }
  t0=$(date +%s)
  {
    nccl_env timeout -k 5 "$lim" "$(bin_of fusion_device_perf)" --model data/models/gpt2-124m.tsv --ranks 1 -A native -n 10 -w 2
    echo "rc=$?"
  } > "$out/$step.log" 2>&1
  rc=$(sed -n 's/^rc=//p' "$out/$step.log" | tail -1)
  if [ "$rc" = 0 ]; then
    lim=$(step_timeout 120)
    if [ "$lim" -gt 0 ]; then
      {
        nccl_env timeout -k 5 "$lim" "$(bin_of fusion_device_perf)" --model data/models/gpt2-124m.tsv --ranks 2 -A ring -n 10 -w 2
        echo "rc=$?"
      } >> "$out/$step.log" 2>&1
      rc2=$(sed -n 's/^rc=//p' "$out/$step.log" | tail -1)
    fi
  fi
  [ "$rc" = 0 ] && rc=$rc2
  key=$(sed -n 's/^# key: //p' "$out/$step.log" | paste -sd ';' | sed 's/;/; /g')
  [ "$rc" = 77 ] && key=$(grep -m1 'no CUDA device' "$out/$step.log")
  [ "$rc" != 0 ] && [ "$rc" != 77 ] && key="$(why_of_rc "$rc" "$lim"); $(grep -v '^rc=' "$out/$step.log" | tail -1)"
  add_row $step "$(status_of_rc "$rc")" $(( $(date +%s) - t0 )) "$key"
}

port_base=$(( 20000 + $$ % 20000 ))
# DPKIT_DEVICE_CHECK_AS_CPU=1 runs the torch steps' "GPU" runs on the CPU: a test of this script's
# own logic on a machine without a GPU (the figures then mean nothing)
gpu_device=cuda
ovh_steps=50 ovh_warmup=5
[ "${DPKIT_DEVICE_CHECK_AS_CPU:-0}" = 1 ] && gpu_device=cpu ovh_steps=6 ovh_warmup=2
# two_procs NAME DEVICE PORT LIMIT ARGS...: torch_ddp_cuda on 2 ranks; echoes "rc0 rc1"
two_procs() {
  local name=$1 dev=$2 port=$3 lim=$4; shift 4
  local bin pid0 pid1 rc0 rc1
  bin=$(bin_of torch_ddp_cuda)
  timeout -k 5 "$lim" "$bin" --device "$dev" --rendezvous "tcp://127.0.0.1:$port" --rank 0 --world-size 2 \
    --loss-log "$out/$name.loss" "$@" > "$out/$name.0.log" 2>&1 &
  pid0=$!
  timeout -k 5 "$lim" "$bin" --device "$dev" --rendezvous "tcp://127.0.0.1:$port" --rank 1 --world-size 2 \
    "$@" > "$out/$name.1.log" 2>&1 &
  pid1=$!
  wait $pid0; rc0=$?
  wait $pid1; rc1=$?
  echo "$rc0 $rc1"
}

run_ddp_two_procs() {
  local step=ddp_two_procs lim rcs t0 key status tol=1e-3
  # SGD with vocabulary 1000: the loss falls steadily (about 7.07 to 5.93 in 20 steps on the CPU), so a
  # gradient lost, doubled or left unaveraged on the GPU shows at once; Adam's early sign-like steps would
  # amplify rounding differences between CPU and GPU instead
  local common=(--optim sgd --lr 1 --vocab 1000 --steps 20 --warmup 2)
  want_step $step || return 0
  need torch_ddp_cuda || { add_row $step "$need_status" 0 "$need_why"; return; }
  lim=$(step_timeout 150)
  [ "$lim" -gt 0 ] || { add_row $step NOT-RUN 0 "time budget spent"; return; }
  t0=$(date +%s)
  rcs=$(two_procs ddp_cuda "$gpu_device" $((port_base + 1)) "$lim" "${common[@]}")
  {
    echo "== 2 processes on the GPU: exit statuses $rcs"
    cat "$out/ddp_cuda.0.log" "$out/ddp_cuda.1.log"
  } > "$out/$step.log"
  if [ "$rcs" = "77 77" ]; then
    add_row $step "SKIP(77)" $(( $(date +%s) - t0 )) "$(head -1 "$out/ddp_cuda.0.log")"; return
  fi
  if [ "$rcs" != "0 0" ]; then
    add_row $step FAIL $(( $(date +%s) - t0 )) "cuda ranks: exit $rcs (124: timed out after $lim s); $(grep -h 'torch_ddp_cuda' "$out"/ddp_cuda.[01].log | head -1)"
    return
  fi
  device_found=1
  lim=$(step_timeout 150)
  [ "$lim" -gt 0 ] || { add_row $step NOT-RUN $(( $(date +%s) - t0 )) "GPU run passed; no time left for the CPU run"; return; }
  rcs=$(two_procs ddp_cpu cpu $((port_base + 2)) "$lim" "${common[@]}")
  {
    echo "== the same 2 processes on the CPU: exit statuses $rcs"
    cat "$out/ddp_cpu.0.log" "$out/ddp_cpu.1.log"
  } >> "$out/$step.log"
  if [ "$rcs" != "0 0" ]; then
    add_row $step FAIL $(( $(date +%s) - t0 )) "cpu ranks: exit $rcs; $(grep -h 'torch_ddp_cuda' "$out"/ddp_cpu.[01].log | head -1)"
    return
  fi
  # per-step mean losses and gradient norms (DDP's compute_stats: on the GPU from the CUDA
  # gradients, in the host reducer on the CPU): largest relative difference, GPU against CPU
  key=$(paste "$out/ddp_cuda.loss" "$out/ddp_cpu.loss" | awk -v tol=$tol '
    function rel(a, b,   d) { d = a - b; if (d < 0) d = -d; return d / (b > 0 ? b : -b) }
    { r = rel($2, $5); if (r > m) { m = r; at = $1 } n++
      g = ($3 == "nan" || $6 == "nan" || $6 == 0) ? 1e9 : rel($3, $6); if (g > gm) { gm = g; gat = $1 }
      if (n == 1) first = $2; last = $2; lastc = $5 }
    END { printf "%d steps, loss %.4f -> %.4f (cpu %.4f), max |gpu-cpu|/cpu %.2e at step %d, grad_norm %.2e at step %d (tol %g); %s",
          n, first, last, lastc, m, at, gm, gat, tol, (n > 0 && m <= tol && gm <= tol) ? "OK" : "TOO FAR" }')
  status=PASS
  [[ $key == *"OK" ]] || status=FAIL
  [ "$(wc -l < "$out/ddp_cuda.loss")" = 20 ] || { status=FAIL; key="$key; expected 20 loss lines"; }
  { echo "== comparison: $key"; paste "$out/ddp_cuda.loss" "$out/ddp_cpu.loss"; } >> "$out/$step.log"
  add_row $step $status $(( $(date +%s) - t0 )) "$key; ranks' parameters bitwise equal (both runs)"
}

run_torch_lm_overhead() {
  local step=torch_lm_overhead lim rc t0 key="" status=PASS port=$((port_base + 3))
  want_step $step || return 0
  need torch_ddp_cuda || { add_row $step "$need_status" 0 "$need_why"; return; }
  t0=$(date +%s)
  : > "$out/$step.log"
  local size label none="" dp="" pg="" ms ran=0 ddp nl nd nh
  for size in "2 128 4" "6 512 8"; do
    read -r nl nd nh <<< "$size"
    label="${nl}x$nd"
    # dpkit: DDP with its default pinned buckets; pageable: --pinned-buckets 0
    for ddp in none dpkit pageable; do
      lim=$(step_timeout 90)
      [ "$lim" -gt 0 ] || { key="$key time budget spent before $label $ddp;"; break 2; }
      local launch=() mode=$ddp
      [ $ddp = pageable ] && mode=dpkit launch=(--pinned-buckets 0)
      [ $mode = dpkit ] && launch+=(--rendezvous "tcp://127.0.0.1:$port" --rank 0 --world-size 1) && port=$((port + 1))
      echo "== $label, ddp $ddp" >> "$out/$step.log"
      timeout -k 5 "$lim" "$(bin_of torch_ddp_cuda)" --device "$gpu_device" --ddp $mode --steps $ovh_steps --warmup $ovh_warmup \
        --layers "$nl" --d-model "$nd" --heads "$nh" "${launch[@]}" >> "$out/$step.log" 2>&1
      rc=$?
      if [ $rc = 77 ]; then add_row $step "SKIP(77)" $(( $(date +%s) - t0 )) "$(grep -m1 'no CUDA device' "$out/$step.log")"; return; fi
      if [ $rc != 0 ]; then status=FAIL; key="$key $label $ddp: $(why_of_rc $rc "$lim");"; continue; fi
      device_found=1 ran=1
      ms=$(grep '^# summary:' "$out/$step.log" | tail -1 | sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p')
      case $ddp in none) none=$ms ;; dpkit) dp=$ms ;; pageable) pg=$ms ;; esac
    done
    if [ -n "$none" ] && [ -n "$dp" ]; then
      key="$key $label: torch $none ms/step, dpkit DDP $dp ms ($(awk -v a="$dp" -v b="$none" 'BEGIN{printf "x%.2f", a/b}'))"
      [ -n "$pg" ] && key="$key, pageable buckets $pg ms ($(awk -v a="$pg" -v b="$none" 'BEGIN{printf "x%.2f", a/b}'))"
      key="$key;"
    fi
    none="" dp="" pg=""
  done
  [ "$status" = PASS ] && [ "$ran" = 0 ] && status=NOT-RUN
  add_row $step $status $(( $(date +%s) - t0 )) "${key# }"
}

# ---------------------------------------------------------------------- main
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -n) ($(nproc 2>/dev/null) CPUs), $(uname -sr)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + uncommitted changes')"
  echo "nvidia-smi: $(nvidia-smi -L 2>/dev/null | head -4 | paste -sd ';' || true)"
  echo "nvcc: ${nvcc:-none} ($nvcc_version)"
  echo "c++: $cxx $($cxx -dumpfullversion 2>/dev/null)"
  echo "NCCL: ${nccl_version:-none} (include $nccl_inc, lib $nccl_lib)"
  echo "doctest: ${doctest_inc:-none}; Gloo: ${gloo_note:-none}"
  echo "torch: $torch_note"
  echo "python candidates: ${pythons[*]:-none}"
  echo "mode: $mode, dry run $dry_run, build dir $build, carry dir $carry, out $out, budget $budget s, jobs $jobs_n"
  echo "CUDA_VISIBLE_DEVICES: ${CUDA_VISIBLE_DEVICES-unset}"
} > "$out/env.txt"
cat "$out/env.txt"

if [ "$mode" = prepare ]; then
  log "prepare: copying headers and libraries into $carry"
  prepare_carry || { echo "prepare: incomplete"; }
  # recompute what the carry dir now offers
  [ "$prebuilt" = 1 ] || exit 0
  log "prepare: building the CUDA programs into $carry/bin (carried; reused on a device with the same nvcc and NCCL)"
  exec "$0" --build-only --cuda-only --carry "$carry" --build "$carry/bin" --out "$out" --jobs "$jobs_n" --budget 100000
fi

log "building (${#targets[@]} targets, $jobs_n at a time) into $build"
if [ "$mode" = build ]; then
  build_all "${targets[@]}"
else
  build_all "${targets[@]}" &
  builder=$!
fi

if [ "$mode" = build ]; then
  fail=0
  for t in "${targets[@]}"; do
    rc=$(cat "$out/build/$t.rc")
    [ "$rc" != 0 ] && [ "$rc" != 3 ] && fail=1
    printf '%-24s rc=%s %4s s  %s\n' "$t" "$rc" "$(cat "$out/build/$t.sec")" "$(cat "$out/build/$t.note")"
  done
  log "build done; binaries: $(du -sh "$build" 2>/dev/null | cut -f1) in $build; carry dir: $(du -sh "$carry" 2>/dev/null | cut -f1)"
  exit $fail
fi

run_doctest_step gpu_nccl test_nccl 120
run_allreduce_perf
run_fusion_perf
run_ddp_two_procs
run_torch_lm_overhead
run_doctest_step gpu_kernels test_kernels 150
run_doctest_step gpu_inproc_device test_inproc_device 240
wait "$builder" 2>/dev/null

# builds in the summary too
build_rows=()
for t in "${targets[@]}"; do
  [ -f "$out/build/$t.rc" ] || continue
  rc=$(cat "$out/build/$t.rc")
  case $rc in 0) s=PASS ;; 3) s=NOT-RUN ;; *) s=FAIL; any_fail=1 ;; esac
  build_rows+=("| build $t | $s | $(cat "$out/build/$t.sec") | $(cat "$out/build/$t.note") |")
done

total=$(elapsed)
if [ $any_fail = 1 ]; then verdict="FAIL"; code=1
elif [ $device_found = 0 ]; then verdict="no CUDA device: every step stopped at its 'no device' exit (77)"; code=77
else verdict="PASS"; code=0; fi
{
  echo "# dpkit device check"
  echo
  sed 's/^/    /' "$out/env.txt"
  grep -h '^# device ' "$out/allreduce_perf.log" 2>/dev/null | sed 's/^# /    /'
  echo
  echo "| step | status | seconds | key figure |"
  echo "|---|---|---|---|"
  printf '%s\n' "${build_rows[@]}" "${summary_rows[@]}"
  echo
  echo "Total: $total s of a $budget s budget. Verdict: $verdict (exit $code). Logs: $out/*.log, builds: $out/build/."
} > "$out/summary.md"
cat "$out/summary.md"
exit $code
