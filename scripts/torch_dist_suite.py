#!/usr/bin/env python3
"""torch's own distributed test suite, run for backend "dpkit" beside "gloo".

    python scripts/torch_dist_suite.py [--backends gloo,dpkit] [--world-sizes 2,3]
        [-k REGEX]... [--subset ci] [--mpi-reserved] [--timeout 240] [--jobs 1]
        [--init-method file|env] [--json OUT] [--markdown] [--report-only]
        [--start-method spawn|forkserver] [--log-dir DIR] [--list] [--show-patch]
        [--report-from SAVED.json]

Run it with the Python whose torch is to be tested (PyPI's torch 2.x in a
venv, Debian's torch 1.13 from /usr/bin/python3 or build-python/venv); for
"dpkit" the package must be installed into that Python
(`pip install --no-build-isolation .`; `import dpkit` registers the backend).

What runs. torch.testing._internal.distributed.distributed_test's
DistributedTest._DistTestBase: the generic suite that torch's
test/distributed/test_distributed_spawn.py runs per backend. That file is not
in the wheel; this script does what it does: BACKEND, WORLD_SIZE, TEMP_DIR
(with barrier/ and test_dir/) and INIT_METHOD in the environment, and
`class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase)`
whose setUp calls self._spawn_processes(), so that each test spawns WORLD_SIZE
fresh processes. Each fresh rank imports torch and the suite: 3-4 s of CPU
with torch 2.15, about 10 s a test on 2 cores. `--start-method forkserver`
forks the ranks instead from a server process that imported them once per
worker (each rank first takes the environment a spawned rank would have had,
see TestDistBackendWithSpawn): the same results (checked on the CI subset
with both torches), 0.3-2 s a test. Each (backend, world size) gets one worker process (this
script, with DPKIT_SUITE_ROLE=worker) that runs the selected tests one by one
with unittest and reports each result to a file; this process watches it. A
test still running after --timeout seconds is killed with its worker's whole
process group (the spawned ranks included), reported as "timeout", and a new
worker goes on with the next test. torch's own per-test timeout
(DISTRIBUTED_TESTS_DEFAULT_TIMEOUT) is set to --timeout - 20 s so that torch
reports a hang first, with the ranks' tracebacks in the log. CI is removed
from the workers' environment (torch's common_utils changes behaviour under
CI: XML reports, periodic tests skipped), so a CI run gets a local run's
results. Without the expecttest package (Debian 12 has none) a stub of it is
used: torch's TestCase derives from expecttest.TestCase, and this suite uses
none of its assertions.

The patch. The suite gates tests by backend name: gloo is its CPU backend
(`BACKEND != "gloo"`, "Only gloo backend supports timeouts", DistTestCases'
capability sets, require_backend_is_available({"gloo"})). To give "dpkit"
gloo's place, the suite's source is copied, patched with the substitutions in
PATCHES (each asserts that its pattern matched, so a torch upgrade that
changes the suite fails loudly, naming the pattern), and imported as the
module `dpkit_patched_distributed_test` from a temporary directory that the
spawned ranks import it from too; DistTestCases' sets get "dpkit" wherever
they have "gloo" (extend_dist_test_cases). `--show-patch` prints both and the
diff for the installed torch. Not patched: the profiling allowlists
(PROFILING_SUPPORTED_BACKENDS): they make the collective tests check for
profiler events named "gloo:all_reduce", which are ProcessGroupGloo's own
instrumentation, not a CPU gate. Both backends run the patched copy (the
patch changes nothing for gloo, except --mpi-reserved). One substitution is
for torch 1.x only (its suite runs DDP over ReplicatedTensor, whose import
fails on Python 3.11 for every backend); PATCHES says which torch each is for.

--mpi-reserved: the CPU tests the suite reserves for BACKEND == "mpi" run for
dpkit and gloo too (gloo's outcome is the reference). In torch 2.15 and 1.13
these are the 12 all_to_all / all_to_all_single tests (equal and unequal
splits, complex, group, full group); the suite's reduce_scatter_tensor,
all_gather_into_tensor and coalescing-manager tests are NCCL/CUDA-only
(skip_if_no_gpu) and do not run on a CPU machine for any backend.

Selection: all tests of the suite by default; -k REGEX (repeatable: any
matches, re.search on the test name); --subset ci: CI_SUBSET below, which
covers each backend operation once (its measured time is in the comment).
--list prints the selection and exits. --jobs N runs N configurations at
once (each in its own worker; the default is 1, one after another).

Output: a line per test and configuration as it finishes; then the table
"test | gloo ws2 | dpkit ws2 | gloo ws3 | dpkit ws3" (tests skipped in every
configuration are listed apart, grouped by reason), the counts per
configuration, each configuration's wall time, the skip reasons of tests
skipped in some configurations only, and for each test where dpkit's outcome
differs from gloo's, the first line of dpkit's error. --markdown prints the
tables as Markdown; --json OUT writes everything (every test's status,
reason or error, seconds) to OUT. --log-dir DIR keeps each worker's output
(the ranks' tracebacks); without it the logs are removed with the temporary
directory.

Exit status: 0; 1 when dpkit fails (failed, error or timeout) a test that
gloo passes at the same world size (with --backends dpkit alone: any dpkit
test that fails); --report-only makes that 0 too; 2 for a setup error (a
patch pattern not found, dpkit's backend unavailable, a worker that cannot
start).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROLE_ENV = "DPKIT_SUITE_ROLE"              # "worker": this file runs the tests (and is the ranks' __main__)
MODULE_DIR_ENV = "DPKIT_SUITE_MODULE_DIR"  # where the patched copy of the suite is
SPEC_ENV = "DPKIT_SUITE_SPEC"              # the worker's task (JSON)
MPI_RESERVED_ENV = "DPKIT_SUITE_MPI_RESERVED"
START_METHOD_ENV = "DPKIT_SUITE_START_METHOD"
PATCHED_MODULE = "dpkit_patched_distributed_test"
SUITE_RELPATH = os.path.join("testing", "_internal", "distributed", "distributed_test.py")

# The substitutions on distributed_test.py: (why, regex, replacement, exact
# count or None for "at least once", the torch versions it is for: a
# (major, minor) range [from, to) or None for all). Applied in order with
# re.MULTILINE; one for the installed torch that does not match is an error.
PATCHES = [
    ("Defines the backends that take gloo's place, and those allowed the MPI-only "
     "CPU tests (gloo and dpkit only with --mpi-reserved).",
     r'^BACKEND = os\.environ\["BACKEND"\]\n',
     'BACKEND = os.environ["BACKEND"]\n'
     '_CPU_BACKENDS = ("gloo", "dpkit")  # torch_dist_suite\n'
     '_MPI_CPU_BACKENDS = ("mpi",) + (_CPU_BACKENDS if os.environ.get("DPKIT_SUITE_MPI_RESERVED") == "1"'
     ' else ())  # torch_dist_suite\n',
     1, None),
    ('Gates `BACKEND != "gloo"`: "Only gloo backend supports timeouts", sparse all_reduce, '
     'batch isend/irecv on CPU, get_future / no_sync (mpi, nccl, gloo), static graph, sync BN, '
     'and the CUDA tests for gloo or nccl.',
     r'BACKEND != "gloo"',
     'BACKEND not in _CPU_BACKENDS',
     None, None),
    ('`BACKEND == "gloo"` inside tests picks the CPU code path (e.g. '
     '_test_accumulate_gradients_no_sync builds its CPU model only for mpi or gloo).',
     r'BACKEND == "gloo"',
     'BACKEND in _CPU_BACKENDS',
     None, None),
    ('require_backend_is_available({"gloo"}) on the all_reduce_coalesced, scatter_object_list, '
     'no_sync and monitored_barrier tests: dpkit passes where gloo does (its check() then '
     'accepts dpkit as a plugin backend, see extend_dist_test_cases).',
     r'^(\s*)if BACKEND not in backends:$',
     r'\1if BACKEND not in backends and not ("gloo" in backends and BACKEND in _CPU_BACKENDS):',
     1, None),
    ('--mpi-reserved: the CPU all_to_all / all_to_all_single tests gated to MPI '
     '("Only MPI supports [CPU] all_to_all[_single]").',
     r'BACKEND != "mpi", "Only MPI supports',
     'BACKEND not in _MPI_CPU_BACKENDS, "Only MPI supports',
     None, None),
    ("torch 1.x: TestDistBackend._run turns on DDP over ReplicatedTensor, which imports "
     "torch.distributed._shard: on Python 3.11 that import fails (a dataclass with a mutable "
     "default), so every DDP test errs for every backend. Off there (plain DDP, as in torch 2).",
     r'^(\s*)_set_ddp_with_replicated_tensor\(True\)$',
     r'\1_set_ddp_with_replicated_tensor(sys.version_info < (3, 11))  # torch_dist_suite',
     1, ((1, 0), (2, 0))),
]

# The tests CI runs (--subset ci): each operation of the backend API once
# (all of them run on CPU, with torch 2.15 and 1.13, at world sizes 2 and 3).
# The suite has no CPU test of reduce_scatter / all_gather_into_tensor (NCCL
# only); all_to_all runs with --mpi-reserved only. On the 2-vCPU VM, gloo
# and dpkit at world sizes 2 and 3 (25 tests run, 2 skipped, per
# configuration), whole command: torch 1.13 89 s with --start-method
# forkserver, 612 s with spawn; torch 2.15 157 s with forkserver (spawn: 486 s
# for world size 2 alone). The whole suite with forkserver: 1.13 339 s,
# 2.15 467 s.
CI_SUBSET = (
    "test_all_reduce_sum",                        # all_reduce
    "test_all_reduce_full_group_max",             # all_reduce on a new_group
    "test_all_reduce_coalesced_sum",              # all_reduce_coalesced
    "test_sparse_all_reduce_sum",                 # all_reduce of a sparse tensor
    "test_broadcast",                             # broadcast (dtypes, every src)
    "test_reduce_sum",                            # reduce
    "test_all_gather",                            # all_gather
    "test_all_gather_coalesced_simple",           # all_gather_coalesced
    "test_gather",                                # gather
    "test_scatter",                               # scatter
    "test_send_recv",                             # send / recv
    "test_send_recv_any_source",                  # recv from any source
    "test_isend",                                 # isend
    "test_batch_isend_irecv_gloo",                # batch_isend_irecv
    "test_barrier",                               # barrier
    "test_barrier_timeout_full_group",            # the group's timeout
    "test_monitored_barrier_gloo",                # monitored_barrier
    "test_get_future",                            # Work.get_future
    "test_destroy_group",                         # new_group / destroy_process_group
    "test_all_gather_object_default_pg",          # object collectives
    "test_all_gather_object_subgroup",            # the same on a subgroup
    "test_scatter_object_list",                   # scatter_object_list
    "test_DistributedDataParallelCPU",            # DDP
    "test_accumulate_gradients_no_sync_allreduce_hook",   # DDP no_sync + comm hook
    "test_ddp_logging_data_cpu",                  # DDP's logging (backend name)
    "test_all_to_all_single_unequal_split",       # all_to_all_single (--mpi-reserved)
    "test_all_to_all",                            # all_to_all (--mpi-reserved)
)


# Differences from gloo that the backend cannot remove, each with its reason
# and the torch versions it holds for (major version: 1 or 2). They are
# reported as "known" and do not make the run fail; docs/python.md's table
# explains each. Anything else dpkit fails that gloo passes fails the run.
KNOWN_DIFFERENCES = {
    "test_ddp_logging_data_cpu": (
        {2}, "torch 2.x's ProcessGroup::getBackendName() names every backend registered through "
             "Backend.register_backend \"custom\" (BackendType::CUSTOM), and DDP logs that name; a backend cannot "
             "change it (torch 1.13, where the group is dpkit's own, passes)"),
    "test_monitored_barrier_gloo": (
        {1}, "torch 1.13's dist.monitored_barrier raises \"monitored_barrier is only implemented for GLOO backend\" "
             "in Python before it reaches any backend (the group's own monitored_barrier runs dpkit's; torch 2.x "
             "passes)"),
}


def known_difference(test: str) -> str | None:
    """The reason dpkit may fail `test` with the torch that runs, or None."""
    import torch
    entry = KNOWN_DIFFERENCES.get(test)
    if entry and int(torch.__version__.split(".")[0]) in entry[0]:
        return entry[1]
    return None


def extend_dist_test_cases(dtc) -> list:
    """Adds "dpkit" to DistTestCases' capability sets wherever "gloo" is
    (backend_feature "gpu", "cuda", "ddp", "subgroup" in torch 2.15 and 1.13:
    the DDP and subgroup tests are gated by them), and to
    backend_feature["plugin"]: require_backend_is_available's check() takes a
    plugin backend as available, and torch 1.13's _test_group_override_backend
    overrides a plugin with gloo. skip_collective lists backends that lack an
    operation; gloo is in none of them. Returns what was added."""
    added = []
    for table_name in ("backend_feature", "skip_collective"):
        table = getattr(dtc, table_name)
        for key, backends in table.items():
            if "gloo" in backends and "dpkit" not in backends:
                backends.add("dpkit")
                added.append(f'DistTestCases.{table_name}["{key}"]')
    plugin = dtc.backend_feature.setdefault("plugin", set())
    if "dpkit" not in plugin:
        plugin.add("dpkit")
        added.append('DistTestCases.backend_feature["plugin"]')
    return added


class PatchError(RuntimeError):
    pass


def suite_source_path() -> str:
    spec = importlib.util.find_spec("torch")     # finds torch without importing it
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"{sys.executable}: no torch")
    path = os.path.join(list(spec.submodule_search_locations)[0], SUITE_RELPATH)
    if not os.path.exists(path):
        raise PatchError(f"torch's distributed suite is not installed: {path}")
    return path


def torch_version(suite_path: str):
    """(major, minor) of the torch that holds suite_path, from its version.py."""
    root = suite_path[: -len(SUITE_RELPATH)]
    with open(os.path.join(root, "version.py"), encoding="utf-8") as f:
        m = re.search(r"^__version__\s*=\s*['\"](\d+)\.(\d+)", f.read(), re.M)
    if not m:
        raise PatchError(f"no __version__ in {root}version.py")
    return int(m.group(1)), int(m.group(2))


def patch_source(src: str, path: str):
    """Applies the PATCHES for the installed torch's version; returns
    (patched text, [(index, why, pattern, count)]). Raises PatchError naming
    the first pattern that did not apply."""
    applied = []
    version = torch_version(path)
    for i, (why, pattern, repl, expected, versions) in enumerate(PATCHES):
        if versions is not None and not versions[0] <= version < versions[1]:
            continue
        src, n = re.subn(pattern, repl, src, flags=re.MULTILINE)
        if n == 0 or (expected is not None and n != expected):
            raise PatchError(f"torch_dist_suite patch {pattern!r} applied {n} times "
                             f"(expected {expected or 'at least 1'}) to {path}: the suite changed; "
                             f"update PATCHES in {os.path.abspath(__file__)}")
        applied.append((i, why, pattern, n))
    return src, applied


def write_patched_suite(directory: str):
    path = suite_source_path()
    with open(path, encoding="utf-8") as f:
        original = f.read()
    patched, applied = patch_source(original, path)
    with open(os.path.join(directory, PATCHED_MODULE + ".py"), "w", encoding="utf-8") as f:
        f.write(patched)
    return path, original, patched, applied


# ----------------------------------------------------------------------------
# Worker role: this file is the worker's __main__ and, through spawn, every
# rank's __mp_main__; both define TestDistBackendWithSpawn at import.

def _install_expecttest_stub():
    import types
    stub = types.ModuleType("expecttest")

    class TestCase(unittest.TestCase):
        longMessage = True

        def assertExpectedInline(self, *args, **kwargs):
            raise unittest.SkipTest("expecttest is not installed (torch_dist_suite's stub)")

        assertExpectedRaisesInline = assertExpectedInline

    stub.TestCase = TestCase
    stub.ACCEPT = False
    stub.__torch_dist_suite_stub__ = True
    sys.modules["expecttest"] = stub


def _import_patched_suite():
    del sys.argv[1:]    # torch's common_utils parses the command line (1.13: on import)
    try:
        import expecttest  # noqa: F401
    except ImportError:
        _install_expecttest_stub()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False      # as test_distributed_spawn.py
    try:     # registers the backend "dpkit"; for gloo's runs too, because torch 1.13's
        import dpkit  # noqa: F401  require_backends_available makes a dist.Backend of every
    except ImportError:      # name in DistTestCases' set (an unregistered one is a ValueError)
        if os.environ["BACKEND"] == "dpkit":
            raise
    from torch.testing._internal.common_distributed import DistTestCases
    extend_dist_test_cases(DistTestCases)
    sys.path.insert(0, os.environ[MODULE_DIR_ENV])
    return importlib.import_module(PATCHED_MODULE)


if os.environ.get(ROLE_ENV) == "worker":
    _suite = _import_patched_suite()

    class TestDistBackendWithSpawn(_suite.TestDistBackend, _suite.DistributedTest._DistTestBase):
        """test_distributed_spawn.py's class: each test spawns WORLD_SIZE ranks.

        With --start-method forkserver the ranks are forked from a server
        that imported this file (torch and the suite) once per worker (the
        ranks' own import of it as __mp_main__ then finds them loaded), instead
        of each importing them anew (3-4 s of CPU per rank with torch 2.15).
        A forked rank has the server's environment, so each rank first takes
        the one a spawned rank would have had (setUp's TEMP_DIR and
        INIT_METHOD), saved beside the test's init file, and the suite's
        INIT_METHOD, which it reads once on import."""

        def setUp(self):
            super().setUp()
            if os.environ.get(START_METHOD_ENV, "spawn") == "spawn":
                self._spawn_processes()
            else:
                with open(self.file_name + ".env", "w", encoding="utf-8") as f:
                    json.dump(dict(os.environ), f)
                import torch.multiprocessing as tmp
                ctx = tmp.get_context("forkserver")
                # The server imports this file as a module (so torch and the suite) before
                # forking; Python 3.11's forkserver does not preload __main__ by itself.
                ctx.set_forkserver_preload([os.path.splitext(os.path.basename(__file__))[0]])
                self._start_processes(ctx.Process)

        @classmethod
        def _run(cls, rank, test_name, file_name, *args, **kwargs):
            if os.environ.get(START_METHOD_ENV, "spawn") != "spawn":
                with open(file_name + ".env", encoding="utf-8") as f:
                    env = json.load(f)
                os.environ.clear()
                os.environ.update(env)
                _suite.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
            return super()._run(rank, test_name, file_name, *args, **kwargs)


_PROCESS_TB = re.compile(r"Process (\d+) exited with error code \d+ and exception:\n(.*?)"
                         r"(?=\nProcess \d+ exited with error code \d+ and exception:|\Z)", re.S)


def exception_line(tb: str) -> str:
    """The first line of the final exception of a traceback text."""
    lines = tb.rstrip().splitlines()
    last_frame = max((i for i, l in enumerate(lines) if l.startswith('  File "')), default=-1)
    for line in lines[last_frame + 1:]:
        if line.strip() and not line.startswith(" "):
            return line.strip()
    return next((l.strip() for l in reversed(lines) if l.strip()), "")


def diagnose(tb: str, failure: bool):
    """(status, first line of the error) from unittest's traceback text. A
    rank's error reaches the parent as 'Process N exited with error code 10
    and exception: <the rank's traceback>'; an AssertionError there (or in
    the parent) is a failed test, anything else an error."""
    procs = _PROCESS_TB.findall(tb)
    if procs:
        rank, rank_tb = procs[0]
        line = exception_line(rank_tb)
        status = "failed" if line.startswith("AssertionError") else "error"
        return status, f"rank {rank}: {line}"
    m = re.search(r"Process \d+ terminated or timed out after [\d.]+ seconds", tb)
    if m:
        return "timeout", m.group(0) + " (torch's timeout)"
    line = exception_line(tb)
    return ("failed" if failure or line.startswith("AssertionError") else "error"), line


def _worker_main():
    import torch
    spec = json.loads(os.environ[SPEC_ENV])
    with open(spec["results"], "a", buffering=1) as out:
        def emit(**rec):
            out.write(json.dumps(rec) + "\n")

        names = unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
        if spec.get("list"):
            info = {"torch": torch.__version__, "python": sys.version.split()[0],
                    "expecttest_stub": bool(getattr(sys.modules["expecttest"], "__torch_dist_suite_stub__", False))}
            if spec.get("check_dpkit"):
                try:
                    import dpkit.distributed as dd
                    info["dpkit_available"] = bool(dd.available())
                    info["dpkit_reason"] = "" if info["dpkit_available"] else str(dd.unavailable_reason())
                    info["dpkit_file"] = os.path.dirname(dd.__file__)
                except Exception as e:   # noqa: BLE001
                    info["dpkit_available"] = False
                    info["dpkit_reason"] = f"{type(e).__name__}: {e}"
            emit(event="list", tests=list(names), **info)
            return
        for name in spec["tests"]:
            emit(event="start", test=name)
            t0 = time.monotonic()
            if name not in names:
                emit(event="done", test=name, status="error", seconds=0.0,
                     error=f"no test {name} in this torch's suite ({torch.__version__})")
                continue
            result = unittest.TestResult()
            TestDistBackendWithSpawn(name).run(result)
            rec = {"status": "passed"}
            if result.skipped:
                rec = {"status": "skipped", "reason": str(result.skipped[0][1])}
            elif result.failures or result.errors:
                failure = bool(result.failures)
                tb = (result.failures or result.errors)[0][1]
                status, line = diagnose(tb, failure)
                rec = {"status": status, "error": line}
            elif result.expectedFailures:
                rec = {"status": "passed", "note": "expected failure"}
            emit(event="done", test=name, seconds=round(time.monotonic() - t0, 2), **rec)


# ----------------------------------------------------------------------------
# Orchestrator.

STATUS_CELL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "timeout": "TIMEOUT",
               "skipped": "skip", None: "-"}
BAD = ("failed", "error", "timeout")


def config_name(backend, ws):
    return f"{backend} ws{ws}"


LIVE_WORKERS = set()    # killed if this process is interrupted (SIGINT, SIGTERM)
STOP = threading.Event()


class Worker:
    """One worker process: its own session (so its spawned ranks die with
    it), its results file read line by line."""

    def __init__(self, tmp, backend, ws, spec, args, log, tag):
        self.results = os.path.join(tmp, f"results-{tag}.jsonl")
        spec = dict(spec, results=self.results)
        temp_dir = tempfile.mkdtemp(prefix=f"{tag}-", dir=tmp)
        for sub in ("barrier", "test_dir"):
            os.makedirs(os.path.join(temp_dir, sub), exist_ok=True)
        env = dict(os.environ)
        env.pop("CI", None)
        env.update({
            ROLE_ENV: "worker", MODULE_DIR_ENV: tmp, SPEC_ENV: json.dumps(spec),
            MPI_RESERVED_ENV: "1" if args.mpi_reserved else "0", START_METHOD_ENV: args.start_method,
            "TMPDIR": temp_dir,     # the tests' temporary files (init files) go where they are removed
            "BACKEND": backend, "WORLD_SIZE": str(ws), "TEMP_DIR": temp_dir,
            "INIT_METHOD": ("env://" if args.init_method == "env"
                            else "file://" + os.path.join(temp_dir, "shared_init_file")),
            "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(max(10, int(args.timeout) - 20)),
            "PYTHONUNBUFFERED": "1",
        })
        if args.start_method == "forkserver":   # the server imports this file by name (its sys.path
            env["PYTHONPATH"] = os.pathsep.join(   # is the default one, not the worker's)
                [os.path.dirname(os.path.abspath(__file__))] + [p for p in [env.get("PYTHONPATH")] if p])
        self.log = log
        log.write(f"\n===== worker {tag}: BACKEND={backend} WORLD_SIZE={ws} "
                  f"tests={len(spec.get('tests', []))}\n")
        log.flush()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env, cwd=temp_dir,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        LIVE_WORKERS.add(self)
        self.offset = 0
        self.partial = ""

    def events(self):
        if not os.path.exists(self.results):
            return []
        with open(self.results, encoding="utf-8") as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()
        return [json.loads(l) for l in lines if l.strip()]

    def kill(self):
        LIVE_WORKERS.discard(self)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=5)
                # the group may outlive its leader: make sure of the ranks too
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def log_tail(path, n=15):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def run_config(tmp, backend, ws, tests, args, print_lock):
    """Runs tests for one (backend, world size); returns (results, seconds)."""
    name = config_name(backend, ws)
    tag = f"{backend}-ws{ws}"
    log_path = os.path.join(args.log_dir or tmp, f"{tag}.log")
    results = {}
    remaining = list(tests)
    t_start = time.monotonic()
    startup_limit = max(120.0, float(args.timeout))
    n_total = len(tests)
    with open(log_path, "a", encoding="utf-8") as log:
        round_no = 0
        while remaining and not STOP.is_set():
            round_no += 1
            w = Worker(tmp, backend, ws, {"tests": remaining}, args, log, f"{tag}-{round_no}")
            current, t0, started_any = None, time.monotonic(), False
            while True:
                exited = w.proc.poll() is not None
                for ev in w.events():
                    if ev["event"] == "start":
                        current, t0, started_any = ev["test"], time.monotonic(), True
                    elif ev["event"] == "done":
                        test = ev.pop("test")
                        ev.pop("event")
                        results[test] = ev
                        remaining.remove(test)
                        current = None
                        _progress(print_lock, name, len(results), n_total, test, ev)
                if exited:
                    break
                if STOP.is_set():
                    w.kill()
                    return results, time.monotonic() - t_start
                if current is not None and time.monotonic() - t0 > args.timeout:
                    w.kill()
                    done = [ev for ev in w.events() if ev["event"] == "done" and ev["test"] == current]
                    if done:            # it ended as it was killed
                        ev = done[0]
                        results[current] = {k: v for k, v in ev.items() if k not in ("event", "test")}
                        remaining.remove(current)
                        _progress(print_lock, name, len(results), n_total, current, results[current])
                        current = None
                        break
                    results[current] = {"status": "timeout", "seconds": round(time.monotonic() - t0, 2),
                                        "error": f"killed by torch_dist_suite after {args.timeout:g} s"}
                    remaining.remove(current)
                    _progress(print_lock, name, len(results), n_total, current, results[current])
                    current = None
                    break
                if current is None and not started_any and time.monotonic() - t0 > startup_limit:
                    w.kill()
                    break
                time.sleep(0.1)
            w.proc.wait()
            LIVE_WORKERS.discard(w)
            if current is not None:     # the worker died within a test
                results[current] = {"status": "error", "seconds": round(time.monotonic() - t0, 2),
                                    "error": f"worker exited with status {w.proc.returncode} during the test"}
                remaining.remove(current)
                _progress(print_lock, name, len(results), n_total, current, results[current])
            elif remaining and not started_any:
                tail = log_tail(log_path)
                raise SetupError(f"{name}: the worker exited ({w.proc.returncode}) before its first test; "
                                 f"log {log_path}:\n{tail}")
    return results, time.monotonic() - t_start


class SetupError(RuntimeError):
    pass


def _progress(lock, name, i, n, test, rec):
    status = rec["status"]
    extra = rec.get("reason") or rec.get("error") or ""
    with lock:
        print(f"[{name} {i}/{n}] {test}: {status} ({rec.get('seconds', 0):.1f} s)"
              + (f": {extra[:160]}" if extra and status != "passed" else ""), flush=True)


def list_tests(tmp, args, backends):
    spec = {"list": True, "check_dpkit": "dpkit" in backends}
    log_path = os.path.join(args.log_dir or tmp, "list.log")
    with open(log_path, "a", encoding="utf-8") as log:
        w = Worker(tmp, "gloo", max(args.world_sizes), spec, args, log, "list")
        try:
            w.proc.wait(timeout=max(180, args.timeout))
        except subprocess.TimeoutExpired:
            w.kill()
    evs = [e for e in w.events() if e["event"] == "list"]
    if not evs:
        raise SetupError(f"could not list the suite's tests; log {log_path}:\n{log_tail(log_path)}")
    return evs[0]


def select(names, args):
    chosen = list(names)
    if args.subset == "ci":
        missing = [t for t in CI_SUBSET if t not in names]
        if missing:
            raise SetupError(f"CI_SUBSET names tests this torch's suite lacks: {', '.join(missing)}")
        chosen = [t for t in names if t in CI_SUBSET]
    if args.k:
        pats = [re.compile(p) for p in args.k]
        chosen = [t for t in chosen if any(p.search(t) for p in pats)]
    return chosen


def show_patch(tmp):
    path, original, patched, applied = write_patched_suite(tmp)
    print(f"# torch_dist_suite: the patch on {path}\n")
    print(f"torch {'.'.join(map(str, torch_version(path)))}: {len(applied)} of the {len(PATCHES)} "
          f"substitutions are for it\n")
    for i, why, pattern, n in applied:
        repl = PATCHES[i][2]
        print(f"{i + 1}. {pattern!r} -> {repl!r}: applied {n}x\n   why: {why}\n")
    print("DistTestCases (torch.testing._internal.common_distributed), at import in every process:")
    print("   " + (extend_dist_test_cases.__doc__ or "").strip().replace("\n", "\n   ") + "\n")
    sys.stdout.writelines(difflib.unified_diff(
        original.splitlines(True), patched.splitlines(True),
        fromfile=path, tofile=PATCHED_MODULE + ".py", n=1))


def _table(headers, rows, markdown):
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*map(str, r)) for r in rows])


def report(tests, configs, results, seconds, args, info):
    md = args.markdown
    names = [config_name(b, ws) for b, ws in configs]
    lines = []
    h = (lambda s: f"\n### {s}\n") if md else (lambda s: f"\n== {s}")
    lines.append(h(f"torch {info['torch']} (Python {info['python']}), "
                   f"{len(tests)} tests x {len(configs)} configurations"))

    def status(t, c):
        r = results.get(c, {}).get(t)
        return r["status"] if r else None

    ran = [t for t in tests if any(status(t, c) not in ("skipped", None) for c in names)]
    rows = [[t] + [STATUS_CELL[status(t, c)] for c in names] for t in ran]
    lines.append(_table(["test"] + names, rows, md))

    lines.append(h("counts"))
    rows = []
    for c in names:
        st = [status(t, c) for t in tests]
        run = sum(s in ("passed",) + BAD for s in st)
        rows.append([c, f"{sum(s == 'passed' for s in st)} of {run}", st.count("failed"), st.count("error"),
                     st.count("timeout"), st.count("skipped"), f"{seconds.get(c, 0):.0f} s"])
    lines.append(_table(["config", "passed of run", "failed", "error", "timeout", "skipped", "wall time"],
                        rows, md))
    lines.append("")
    for ws in sorted({ws for _, ws in configs}):
        parts = []
        for b in [b for b, w in configs if w == ws]:
            st = [status(t, config_name(b, ws)) for t in tests]
            run = sum(s in ("passed",) + BAD for s in st)
            parts.append(f"{b} passes {st.count('passed')} of {run} run")
        lines.append(f"ws{ws}: " + "; ".join(parts))

    partial = []
    for t in tests:
        sts = [status(t, c) for c in names]
        if "skipped" in sts and any(s not in ("skipped", None) for s in sts):
            for c in names:
                if status(t, c) == "skipped":
                    partial.append([t, c, results[c][t].get("reason", "")])
    if partial:
        lines.append(h("skipped in some configurations only"))
        lines.append(_table(["test", "config", "reason"], partial, md))

    all_skipped = {}
    for t in tests:
        if t not in ran and any(status(t, c) == "skipped" for c in names):
            reason = next(results[c][t].get("reason", "") for c in names if status(t, c) == "skipped")
            all_skipped.setdefault(reason, []).append(t)
    if all_skipped:
        lines.append(h(f"skipped in every configuration: {sum(map(len, all_skipped.values()))} tests"))
        for reason, ts in sorted(all_skipped.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {reason} ({len(ts)}): {', '.join(ts)}")

    diffs, regressions = {}, []     # (test, gloo, dpkit) -> [world sizes, dpkit's first error]
    known = {}                      # test -> why (KNOWN_DIFFERENCES): reported, not a failure
    for ws in sorted({ws for _, ws in configs}):
        g, d = config_name("gloo", ws), config_name("dpkit", ws)
        if d not in names:
            continue
        for t in tests:
            sg, sd = status(t, g) if g in names else None, status(t, d)
            if (g in names and sg != sd) or (g not in names and sd in BAD):
                r = results[d].get(t, {})
                why = r.get("error") or r.get("reason") or ""
                diffs.setdefault((t, STATUS_CELL[sg], STATUS_CELL[sd]), [[], why[:200]])[0].append(str(ws))
                if sd in BAD and (sg == "passed" or g not in names):
                    if known_difference(t):
                        known.setdefault(t, known_difference(t))
                    else:
                        regressions.append(f"{t} ws{ws}")
    if diffs:
        lines.append(h(f"dpkit differs from gloo: {len(regressions)} test runs that gloo passes and dpkit fails"
                       + (f" (and {len(known)} known difference(s), below)" if known else "")))
        rows = [[t, ",".join(v[0]), sg, sd, v[1]] for (t, sg, sd), v in diffs.items()]
        lines.append(_table(["test", "ws", "gloo", "dpkit", "dpkit's error (first line, first world size) or skip reason"],
                            rows, md))
    for t, why in known.items():
        lines.append(f"- known difference, {t}: {why}")
    return "\n".join(lines), regressions


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="gloo,dpkit")
    p.add_argument("--world-sizes", default="2,3")
    p.add_argument("-k", action="append", metavar="REGEX", help="select tests whose name matches (repeatable)")
    p.add_argument("--subset", choices=["all", "ci"], default="all")
    p.add_argument("--mpi-reserved", action="store_true",
                   help="run the CPU tests the suite reserves for MPI (all_to_all) for dpkit and gloo too")
    p.add_argument("--timeout", type=float, default=240, help="seconds per test (default 240)")
    p.add_argument("--jobs", type=int, default=1, help="configurations run at once (default 1)")
    p.add_argument("--init-method", choices=["file", "env"], default="file",
                   help="INIT_METHOD's scheme, as test_distributed_spawn's two runs (default file)")
    p.add_argument("--start-method", choices=["spawn", "forkserver"], default="spawn",
                   help="how the ranks start: spawn (test_distributed_spawn's; default) or forkserver "
                        "(forked from a process that imported the suite once per worker: faster)")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--report-only", action="store_true", help="exit 0 whatever dpkit's results")
    p.add_argument("--log-dir", help="keep the workers' logs here")
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    p.add_argument("--report-from", metavar="JSON", help="print the report of a saved --json run and exit")
    p.add_argument("--show-patch", action="store_true", help="print the patch for the installed torch and exit")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.world_sizes = [int(w) for w in args.world_sizes.split(",") if w]
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.report_from:
        with open(args.report_from, encoding="utf-8") as f:
            saved = json.load(f)
        configs = [(b, ws) for ws in saved["world_sizes"] for b in saved["backends"]]
        text, regressions = report(saved["tests"], configs, saved["results"], saved["seconds"], args,
                                   {"torch": saved["torch"], "python": saved["python"]})
        print(text)
        return 1 if regressions and not args.report_only else 0
    tmp = tempfile.mkdtemp(prefix="torch_dist_suite-")
    try:
        if args.show_patch:
            show_patch(tmp)
            return 0
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
        write_patched_suite(tmp)
        info = list_tests(tmp, args, args.backends)
        if "dpkit" in args.backends and not info.get("dpkit_available"):
            raise SetupError(f"the dpkit backend is not available in {sys.executable}: {info.get('dpkit_reason')}")
        tests = select(info["tests"], args)
        if args.list:
            print("\n".join(tests))
            return 0
        print(f"torch {info['torch']}, Python {info['python']} ({sys.executable}); "
              f"{len(tests)} of {len(info['tests'])} tests; backends {','.join(args.backends)}; "
              f"world sizes {','.join(map(str, args.world_sizes))}; ranks by {args.start_method}"
              + (f"; dpkit from {info['dpkit_file']}" if info.get("dpkit_file") else "")
              + ("; expecttest: stub" if info.get("expecttest_stub") else ""), flush=True)
        configs = [(b, ws) for ws in args.world_sizes for b in args.backends]
        results, seconds = {}, {}
        lock = threading.Lock()
        errors = []

        def job(cfg):
            try:
                r, s = run_config(tmp, cfg[0], cfg[1], tests, args, lock)
                results[config_name(*cfg)], seconds[config_name(*cfg)] = r, s
            except SetupError as e:
                errors.append(str(e))

        t0 = time.monotonic()
        pending = list(configs)
        threads = []
        while pending or threads:
            threads = [t for t in threads if t.is_alive()]
            while pending and len(threads) < max(1, args.jobs):
                t = threading.Thread(target=job, args=(pending.pop(0),), daemon=True)
                t.start()
                threads.append(t)
            time.sleep(0.2)
        total = time.monotonic() - t0
        text, regressions = report(tests, configs, results, seconds, args, info)
        print(text)
        print(f"\ntotal wall time {total:.0f} s"
              + (f" ({args.jobs} configurations at once)" if args.jobs > 1 else ""))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"torch": info["torch"], "python": info["python"], "executable": sys.executable,
                           "backends": args.backends, "world_sizes": args.world_sizes,
                           "mpi_reserved": args.mpi_reserved, "init_method": args.init_method,
                           "start_method": args.start_method,
                           "timeout": args.timeout, "tests": tests,
                           "seconds": seconds, "total_seconds": total,
                           "results": results, "regressions": regressions,
                           "patch": [{"pattern": p, "replacement": r, "why": w} for w, p, r, _, _ in PATCHES],
                           "setup_errors": errors}, f, indent=1)
        if errors:
            for e in errors:
                print(f"setup error: {e}", file=sys.stderr)
            return 2
        if regressions:
            print(f"\ndpkit fails {len(regressions)} test(s) that gloo passes"
                  + (" (--report-only: exit 0)" if args.report_only else ""))
            return 0 if args.report_only else 1
        return 0
    except (PatchError, SetupError) as e:
        print(f"torch_dist_suite: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torch_dist_suite: interrupted", file=sys.stderr)
        return 130
    finally:
        STOP.set()
        for w in list(LIVE_WORKERS):
            w.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    if os.environ.get(ROLE_ENV) == "worker":
        _worker_main()
    else:
        signal.signal(signal.SIGTERM, _interrupted)   # CI's timeout: the workers' sessions go too
        sys.exit(main())
