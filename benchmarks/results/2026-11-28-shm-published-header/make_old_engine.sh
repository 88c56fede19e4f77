#!/bin/sh
# Writes $OUT_DIR/old_engine.hpp (default /tmp/dpkit-engine-ab): the shared-memory engine as of commit REV (default
# 83070a0, before the receiver polled the fragment headers), wrapped in
# namespace dpkit::detail::v0 so that engine_ab.cpp can run it beside the
# current one in the same two processes.
# Usage, from the repository root:
#   sh benchmarks/results/2026-11-28-shm-published-header/make_old_engine.sh [REV]
set -e
REV=${1:-83070a0}
D=${OUT_DIR:-/tmp/dpkit-engine-ab}; mkdir -p "$D"
git show "$REV:include/dpkit/transport/detail/shm_p2p.hpp" | python3 -c '
import sys
s = sys.stdin.read()
body = s.split("namespace dpkit::detail {", 1)[1].rsplit("} // namespace dpkit::detail", 1)[0]
print("#pragma once\n#include \"dpkit/transport/detail/shm_p2p.hpp\"\n#include <sys/uio.h>\n#include <unistd.h>")
print("namespace dpkit::detail::v0 {" + body + "} // namespace dpkit::detail::v0")
' > "$D/old_engine.hpp"
