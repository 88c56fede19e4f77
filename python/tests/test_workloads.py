"""Workloads beyond DDP over the backend "dpkit" (workloads.py): FSDP2
training, torch.distributed.checkpoint saved at 3 ranks and loaded at 2,
a pipeline (torch.distributed.pipelining's schedules and send/recv by hand)
and a mixture-of-experts all_to_all dispatch. Each runs on "dpkit" and on
"gloo" in the same processes and is checked against the other backend and
against a single-process computation: these are the users of
all_gather_single / reduce_scatter_single, the object collectives, P2P
(batch_isend_irecv) and all_to_all_single with uneven and empty splits that
DDP never calls. Ranks are plain processes with torch's env:// variables
(test_torch_launch.run_ranks). FSDP2, DeviceMesh.from_group, DCP's
state_dict API and pipelining need torch 2.x: on Debian's torch 1.13 those
tests skip and the by-hand pipeline and the MoE dispatch still run."""
import json
import pathlib
import sys
import time

import pytest
import torch

import dpkit
from test_torch_launch import run_ranks

WORKER = pathlib.Path(__file__).with_name("workloads.py")
TIMEOUT = 90  # per case (one launch); each takes 10-30 s on a 2-vCPU machine

pytestmark = pytest.mark.skipif(not dpkit.distributed.available(), reason="the backend was not built")


def missing(*names):
    """The first of `names` (module or module:attribute) this torch lacks,
    or None."""
    import importlib
    for name in names:
        mod, _, attr = name.partition(":")
        try:
            m = importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - torch 1.13's fsdp does not even import on Python 3.11 (ValueError)
            return name
        if attr and not hasattr(m, attr):
            return name
    return None


FSDP2 = ("torch.distributed.fsdp:fully_shard", "torch.distributed.device_mesh:DeviceMesh")


def needs(*names):
    lack = missing(*names)
    if lack is None and "torch.distributed.device_mesh:DeviceMesh" in names:
        from torch.distributed.device_mesh import DeviceMesh
        lack = None if hasattr(DeviceMesh, "from_group") else "DeviceMesh.from_group"
    if lack:
        pytest.skip(f"torch {torch.__version__} has no {lack}")


def launch(case, outdir, world):
    t0 = time.monotonic()
    run_ranks([sys.executable, str(WORKER), case, str(outdir)], world, timeout=TIMEOUT)
    wall = time.monotonic() - t0
    res = [json.loads((outdir / f"{case}-rank{r}.json").read_text()) for r in range(world)]
    print(f"{case} at {world} ranks: {wall:.1f} s wall")
    return res


def ok(res, what):
    """res (one backend's result) has no error."""
    assert "error" not in res, f"{what}: {res.get('error')} at {res.get('where')}"
    return res


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2(world, tmp_path):
    """FSDP2 training, 20 steps: the per-rank losses on "dpkit" equal
    gloo's bit for bit where both reduce-scatters sum the ranks' gradients
    in the same order (the reduce_order probe; always at 2 ranks), within
    1e-5 otherwise; both within 1e-5 of the single-process run."""
    needs(*FSDP2)
    res = launch("fsdp2", tmp_path, world)
    same_order = all(set(r["reduce_order"]["dpkit"]["avg"]) & set(r["reduce_order"]["gloo"]["avg"]) for r in res)
    for r in res:
        d, g = ok(r["backends"]["dpkit"], "dpkit"), ok(r["backends"]["gloo"], "gloo")
        for b in ("dpkit", "gloo"):
            assert ok(r["reduce_order"][b], b)["avg"], (b, "reduce_scatter AVG is no fold of the inputs", r["reduce_order"])
            assert r["backends"][b]["max_rel_diff_vs_reference"] < 1e-5, (b, r["backends"][b])
        c = r["compare"]
        if same_order:
            assert c["local_losses_equal"] and c["mean_losses_equal"] and c["params_equal"], c
        assert c["max_abs_diff_local_losses"] < 1e-4 and c["max_abs_diff_mean_losses"] < 1e-4, c
        print(f"  rank {r['rank']}: steps 10-19 dpkit {d['steady_s']} s, gloo {g['steady_s']} s; losses equal "
              f"{c['local_losses_equal']} (max diff {c['max_abs_diff_local_losses']:.3g}), reduce order "
              f"dpkit {r['reduce_order']['dpkit']['avg']} gloo {r['reduce_order']['gloo']['avg']}")
    if world == 2:
        assert same_order


def test_dcp_3_to_2(tmp_path):
    """DCP: model + AdamW state (FSDP2-sharded, or replicated where
    fully_shard fails on the backend) saved at 3 ranks, loaded at 2: every
    tensor (local shards and full tensors) equal to what the 3 ranks held,
    a fresh model differs before the load, the eval loss equal; with
    "dpkit" and with "gloo" as the process group DCP and the mesh use."""
    needs(*FSDP2, "torch.distributed.checkpoint:save", "torch.distributed.checkpoint.state_dict:get_state_dict")
    saved = launch("dcp_save", tmp_path, 3)
    for r in saved:
        for b in ("dpkit", "gloo"):
            ok(r["backends"][b], b)
    loaded = launch("dcp_load", tmp_path, 2)
    for r in loaded:
        for b in ("dpkit", "gloo"):
            x = ok(r["backends"][b], b)
            assert x["saved_world"] == 3 and x["keys_equal"] and x["compared"] > 100, (b, x)
            assert x["n_mismatches"] == 0, (b, x["mismatches"])
            assert x["mismatches_before_load"] > 100, (b, x)
            assert x["eval_loss_equal"], (b, x)
        print(f"  rank {r['rank']}: {r['backends']['dpkit']['mode']} {r['backends']['dpkit']['compared']} entries; "
              f"save s dpkit {saved[0]['backends']['dpkit']['save_s']} gloo {saved[0]['backends']['gloo']['save_s']}, "
              f"load s dpkit {r['backends']['dpkit']['load_s']} gloo {r['backends']['gloo']['load_s']}")


@pytest.mark.parametrize("world", [2, 3])
def test_pipeline(world, tmp_path):
    """One stage per rank, 10 steps of 4 micro-batches: the last stage's
    losses and every stage's parameters equal one process running the whole
    model (1e-6 relative; exact here so far), and "dpkit"'s parameters
    equal gloo's bit for bit (P2P moves the same bytes); by hand
    (send/recv) always, ScheduleGPipe and Schedule1F1B where torch has
    torch.distributed.pipelining (by hand alone passes the test)."""
    res = launch("pipeline", tmp_path, world)
    names = ["by_hand"] + ([] if "pipelining_missing" in res[0] else ["gpipe", "1f1b"])
    for r in res:
        for name in names:
            for b in ("dpkit", "gloo"):
                x = ok(r[name][b], f"{name} on {b}")
                assert x["max_abs_diff_params_vs_reference"] <= 1e-6, (name, b, x)
                if r["rank"] == world - 1:
                    assert x["max_rel_diff_vs_reference"] <= 1e-6, (name, b, x)
            assert r[name]["params_equal_across_backends"], (name, r[name])
    last = res[-1]
    print("  " + ", ".join(f"{n}: exact {last[n]['dpkit']['losses_equal_reference']}" for n in names)
          + (f" (no schedules: {res[0]['pipelining_missing']})" if "pipelining_missing" in res[0] else ""))


@pytest.mark.parametrize("world", [2, 3])
def test_moe(world, tmp_path):
    """MoE dispatch: counts by all_to_all_single, tokens there and back by
    all_to_all_single with uneven and empty splits (a rank that sends
    nothing to an expert, experts that receive nothing, ~2000 tokens a
    rank): the output equals the single-process computation bit for bit
    on both backends."""
    res = launch("moe", tmp_path, world)
    for r in res:
        for rnd in ("natural", "skip_next_expert", "all_to_expert0", "large"):
            for b in ("dpkit", "gloo"):
                x = ok(r[rnd][b], f"{rnd} on {b}")
                assert x["equal_reference"], (rnd, b, x)
            assert r[rnd]["equal_across_backends"], (rnd, r[rnd])
    assert any(0 in r["skip_next_expert"]["dpkit"]["recv_counts"] for r in res)
