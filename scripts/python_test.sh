#!/usr/bin/env bash
# The Python package's tests: `pip install .` into a virtual environment in
# build-python/venv (with Debian's site packages: python3-torch, meson-python,
# pybind11, pytest, tqdm; nothing is downloaded), then pytest python/tests.
# Called by scripts/test.sh; runs alone too. The build directory
# build-python/build is kept, so a second run rebuilds only what changed.
#   scripts/python_test.sh                  install, then test
#   scripts/python_test.sh --install-only   (scripts/test.sh runs it beside the release build)
#   scripts/python_test.sh --no-install     test what is installed
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
py=/usr/bin/python3   # Debian's Python: the one python3-torch is for
venv=build-python/venv
install=1 tests=1
case "${1:-}" in
  --install-only) tests=0; shift ;;
  --no-install) install=0; shift ;;
esac
if [ "$install" = 1 ]; then
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv --system-site-packages "$venv"
  fi
  start=$SECONDS
  "$venv/bin/pip" install --quiet --no-build-isolation --no-deps --no-index \
    --config-settings=builddir="$PWD/build-python/build" .
  echo "== [python_test.sh] pip install .: $((SECONDS - start)) s"
fi
[ "$tests" = 1 ] || exit 0
cd build-python   # not the source tree, so `import dpkit` is the installed package
start=$SECONDS
"$PWD/venv/bin/python" -m pytest -q -p no:cacheprovider --durations=8 ../python/tests "$@"
echo "== [python_test.sh] pytest: $((SECONDS - start)) s"
# torch's own distributed test suite, "dpkit" beside "gloo" at world sizes 2
# and 3 (its CI subset: each backend operation once, with the all-to-all
# tests torch reserves for MPI): fails when dpkit fails a test gloo passes
# (docs/python.md, "torch's own tests")
start=$SECONDS
"$PWD/venv/bin/python" ../scripts/torch_dist_suite.py --subset ci --mpi-reserved --start-method forkserver
echo "== [python_test.sh] torch's distributed suite (CI subset): $((SECONDS - start)) s"
