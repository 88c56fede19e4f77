#!/usr/bin/env bash
# Installs dpkit into a temporary prefix and builds examples/consumer against
# the installed package twice: with pkg-config and with CMake find_package.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
prefix=$(mktemp -d /tmp/dpkit-prefix.XXXXXX)
trap 'rm -rf "$prefix" build-install build-consumer-cmake' EXIT
meson setup build-install --prefix="$prefix" -Dtests=disabled -Dbenchmarks=disabled -Dexamples=disabled >/dev/null
meson install -C build-install >/dev/null
pcdir=$(dirname "$(find "$prefix" -name dpkit.pc | head -1)")
echo "consumer: pkg-config ($pcdir)"
PKG_CONFIG_PATH="$pcdir" g++ -Wall -Wextra -O2 examples/consumer/main.cpp \
  $(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs dpkit) -o "$prefix/consumer_pc"
"$prefix/consumer_pc"
echo "consumer: cmake find_package(dpkit)"
cmake -S examples/consumer -B build-consumer-cmake -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build-consumer-cmake >/dev/null
build-consumer-cmake/dpkit_consumer
