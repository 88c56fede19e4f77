#!/usr/bin/env bash
# Installs dpkit's build and test dependencies from Debian's packages when any
# is missing (needs root, as on CI and the reference machines). CUDA 13 and
# NCCL are expected at /usr/local/cuda when the cuda feature is wanted; without
# them the build simply leaves CUDA out.
set -euo pipefail
pkgs=(meson ninja-build pkg-config cmake g++ libopenmpi-dev openmpi-bin doctest-dev libcli11-dev libsimdjson-dev python3
      xz-utils libeigen3-dev clang-14 libclang-rt-14-dev   # corpus, Eigen (tests), clang for TSan and fuzzing
      libtorch-dev python3-torch libsentencepiece-dev      # the torch feature (DDP for libtorch)
      python3-dev python3-venv python3-pip python3-mesonpy pybind11-dev python3-pytest python3-tqdm   # the Python package
      libgloo-dev libhiredis-dev redis-server)             # the gloo feature; redis-server for its Redis test
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
