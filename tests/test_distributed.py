"""DDP on two processes of this machine (gloo over loopback): per-rank audits, their merge, DDP's
gradient buckets, gradient formats, and a break planted on one rank only.

The workers are this file run as a script, one process per rank, training the model of
``examples/ddp_train.py``. Every run is bounded: the process group times out its init and
collectives, the launcher kills what is still running at its deadline, and each test checks
that no process it started (marked by a token in its environment) is left.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_train.py"
WORLD = 2
TOKEN_VAR = "AUDITOR_DDP_TEST_TOKEN"

#: name -> audit_run options; every rank runs all of them in one process group.
SCENARIOS = {
    "same": dict(steps=3, bucket_view=True),
    "planted": dict(steps=3, bucket_view=False, plant_rank=1),
    "wrap_first_view": dict(steps=1, bucket_view=True, wrap_first=True),
    "wrap_first_copy": dict(steps=1, bucket_view=False, wrap_first=True),
}


# -- the launcher --------------------------------------------------------------------------------


def _pids_with(token: str) -> list[int]:
    """Processes whose environment carries ``token``: the workers and anything they started."""
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{d}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(d))
        except OSError:
            continue
    return found


def _kill(token: str) -> None:
    for pid in _pids_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launch(mode: str, out: Path, deadline_s: float) -> dict:
    """Run ``WORLD`` ranks of ``mode``; kill them all when one fails or at ``deadline_s``.

    Returns the exit codes, the tail of each rank's log, the time taken and the token."""
    token = uuid.uuid4().hex
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        TOKEN_VAR: token,
    }
    store = out / "store"
    procs, logs = [], []
    start = time.monotonic()
    try:
        for rank in range(WORLD):
            log = open(out / f"worker{rank}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, __file__, mode, str(out), str(store)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        # like torch.multiprocessing.spawn: the first failure ends the others
        timed_out = False
        while True:
            codes = [p.poll() for p in procs]
            if None not in codes or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() - start > deadline_s:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        _kill(token)
        for p in procs:
            p.wait(timeout=30)
        for log in logs:
            log.close()
    text = "\n".join(
        f"--- rank {r} (exit {p.returncode}) ---\n" + (out / f"worker{r}.log").read_text()[-4000:]
        for r, p in enumerate(procs)
    )
    return {
        "codes": [p.returncode for p in procs], "timed_out": timed_out, "log": text,
        "seconds": time.monotonic() - start, "token": token,
    }


# -- the workers (this file run as a script) ---------------------------------------------------


def _load_example():
    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference_grads(ex, world: int):
    """Gradients of one step without DDP: the mean over every rank's batch of a local replica."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    ref = ex.Net().to(memory_format=torch.channels_last)
    for r in range(world):
        x, y = ex.make_batch(r, 0)
        (F.cross_entropy(ref(x), y) / world).backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def _worker(mode: str, out: str, store: str) -> None:
    import torch
    import torch.distributed as dist

    from auditor.distributed import check_grad_formats

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        if mode == "hang":  # rank 1 never joins the collective; rank 0's times out
            group = dist.new_group(timeout=datetime.timedelta(seconds=3))
            if rank == 1:
                time.sleep(3600)
            dist.all_reduce(torch.ones(1), group=group)
            return
        ex = _load_example()
        import auditor
        from auditor.distributed import save_rank_audit

        with auditor.FormatAuditor() as fa:  # DDP's constructor: it broadcasts rank 0's state
            ex.build(rank)
        save_rank_audit(fa.audit, Path(out, "construct"))
        for name, kw in SCENARIOS.items():
            d = Path(out, name)
            _, ddp, _ = ex.audit_run(str(d), **kw)
            check_grad_formats(ddp).to_csv(d / f"grads.rank{rank}.csv", index=False)
            if kw["steps"] == 1:
                ref = _reference_grads(ex, world)
                err = max(float((p.grad - ref[n]).abs().max()) for n, p in ddp.module.named_parameters())
                (d / f"grad_error.rank{rank}.txt").write_text(repr(err))
        dist.barrier()  # leave together, as the example does (and for the same reason)
    finally:
        dist.destroy_process_group()


# -- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    res = launch("train", out, deadline_s=150)
    assert _pids_with(res["token"]) == [], "worker processes outlived the run"
    assert not res["timed_out"] and res["codes"] == [0] * WORLD, res["log"]
    res["out"] = out
    return res


def _merged(run, name):
    from auditor.distributed import merge_rank_audits

    return merge_rank_audits(run["out"] / name)


def _grads(run, name):
    import pandas as pd

    return pd.concat(
        [pd.read_csv(run["out"] / name / f"grads.rank{r}.csv").assign(rank=r) for r in range(WORLD)],
        ignore_index=True,
    )


def test_per_rank_logs_written_and_merged(run):
    from auditor import Audit

    for name in SCENARIOS:
        files = sorted(p.name for p in (run["out"] / name).glob("audit.rank*.csv"))
        assert files == ["audit.rank0.csv", "audit.rank1.csv"]
    merged = _merged(run, "same")
    assert merged.ranks == [0, 1] and merged.world_size == 2 and merged.complete
    for r, a in merged.per_rank.items():
        assert set(a.events["rank"]) == {r} and set(a.events["world_size"]) == {2}
        single = Audit.read_csv(run["out"] / "same" / f"audit.rank{r}.csv")
        assert len(single.events) == len(a.events)
    ev, t = merged.events, merged.tensors
    assert len(ev) == sum(len(a.events) for a in merged.per_rank.values())
    assert list(ev.groupby("rank")["seq"].min()) == [0, 0]  # seq restarts on each rank
    assert str(ev["op"].dtype) == "category" and "rank" in t.columns
    assert (ev[["rank", "seq"]].value_counts() == 1).all()
    # collectives and the reducer's ops reach the dispatch mode, in backward
    ops = set(ev.loc[ev["phase"] == "backward", "op"].astype(str))
    assert "c10d.allreduce_.default" in ops and "aten.mul.out" in ops


def test_identical_hotspots_on_both_ranks(run):
    merged = _merged(run, "same")
    hot = merged.hotspots()
    per = [g.drop(columns="rank").reset_index(drop=True) for _, g in hot.groupby("rank")]
    assert len(per) == 2 and len(per[0]) > 0  # the channel shuffle, on both ranks
    assert per[0].equals(per[1])
    assert set(hot["module"]) >= {"shuffle"}
    assert merged.differences().empty
    assert "identical on every rank" in merged.report()


def test_planted_break_is_a_difference_between_ranks(run):
    merged = _merged(run, "planted")
    diff = merged.differences()
    assert len(diff) and set(diff["rank"]) == {1}
    planted = diff[(diff["module"] == "mid") & (diff["status"] == "appeared")]
    assert list(planted["op"]) == ["aten.clone.default"] and list(planted["phase"]) == ["forward"]
    assert (planted["count_after"] == 3).all()  # one per step
    # the shared break is not a difference
    assert not (diff["module"] == "shuffle").any()
    report = merged.report()
    assert "Hotspots differ between ranks" in report and " mid " in report
    # one Audit over both ranks: nothing links across ranks, so its groups add up the ranks'
    one = merged.to_audit()
    assert (one.events["seq"].to_numpy() == range(len(one.events))).all()
    keys = ["phase", "module", "op", "source", "kind"]
    summed = merged.hotspots().groupby(keys)[["count", "bytes"]].sum().sort_index()
    assert one.hotspots().groupby(keys)[["count", "bytes"]].sum().sort_index().equals(summed)


def test_grad_formats_after_the_step(run):
    for name in ("same", "planted", "wrap_first_copy"):
        g = _grads(run, name)
        assert g["ok"].all(), g
        conv = g[g["parameter"].str.startswith("conv") & g["parameter"].str.endswith("weight")]
        assert len(conv) == 3 * WORLD and (conv["grad_format"] == "channels_last").all()
    # wrapped before the conversion, with bucket views: .grad is the (contiguous) bucket view
    g = _grads(run, "wrap_first_view")
    bad = g[~g["ok"]]
    assert sorted(set(bad["parameter"])) == ["conv1.weight", "conv2.weight", "conv3.weight"]
    assert (bad["param_format"] == "channels_last").all() and (bad["grad_format"] == "contiguous").all()


@pytest.mark.parametrize("name,bucket_view", [("same", True), ("planted", False)])
def test_bucket_copies_keep_the_layout(run, name, bucket_view):
    merged = _merged(run, name)
    ops = merged.bucket_ops()
    bw = ops[(ops["phase"] == "backward") & (ops["collective"] == "c10d.allreduce_.default")]
    n_params, steps = 9, 3
    for r in (0, 1):
        mine = bw[bw["rank"] == r]
        assert (mine["stage"] == "into").sum() == n_params * steps
        # without bucket views DDP copies every gradient back out of the bucket
        assert (mine["stage"] == "out").sum() == (0 if bucket_view else n_params * steps)
        weights = mine[mine["from_format"] == "channels_last"]
        assert len(weights) == 3 * steps * (1 if bucket_view else 2)
        assert (weights["to_format"] == "channels_last").all()
    assert not ops["layout_change"].any() and not ops["view_mismatch"].any()
    assert merged.bucket_hotspots().empty
    assert "No copy into or out of a bucket changes the layout" in merged.report()


def test_wrapping_before_the_conversion_is_found(run):
    # gradient_as_bucket_view=True: each channels_last gradient is copied into a contiguous
    # bucket view, which then becomes .grad (see test_grad_formats_after_the_step); values are right
    view = _merged(run, "wrap_first_view").bucket_hotspots()
    for r in (0, 1):
        mine = view[view["rank"] == r].set_index(["phase", "stage"])
        assert mine.loc[("backward", "into"), "op"] == "aten.mul.out"
        assert mine.loc[("backward", "into"), "from_format"] == "channels_last"
        assert mine.loc[("backward", "into"), "to_format"] == "contiguous"
        assert mine.loc[("backward", "into"), "count"] == 3  # the three conv weights
        assert len(mine) == 1 and not mine["view_mismatch"].any()
    # without bucket views: written through the old layout, read through the new one
    copy = _merged(run, "wrap_first_copy")
    hot = copy.bucket_hotspots()
    assert hot["view_mismatch"].any()
    assert set(hot.loc[hot["view_mismatch"], "stage"]) == {"into", "out"}
    assert "VIEW MISMATCH" in copy.report()
    # and the flag agrees with the values: the gradients differ from a run without DDP
    for name, flagged in (("wrap_first_view", False), ("wrap_first_copy", bool(hot["view_mismatch"].any()))):
        for r in (0, 1):
            err = float((run["out"] / name / f"grad_error.rank{r}.txt").read_text())
            assert (err > 1e-3) == flagged, (name, r, err)


def test_construction_broadcast_flattens_through_contiguous(run):
    # DDP's constructor broadcasts the parameters as one flat buffer: each 4-D weight is cloned
    # to NCHW to be flattened, and copied back into channels_last afterwards (once per run)
    hot = _merged(run, "construct").bucket_hotspots()
    for r in (0, 1):
        mine = hot[hot["rank"] == r].set_index("stage")
        assert set(mine.index) == {"flatten", "out"} and (mine["phase"] == "forward").all()
        assert (mine["collective"] == "c10d.broadcast_.default").all()
        assert mine.loc["flatten", "op"] == "aten.clone.default" and mine.loc["flatten", "count"] == 3
        assert (mine.loc["flatten", "from_format"], mine.loc["flatten", "to_format"]) == (
            "channels_last", "contiguous")
        assert mine.loc["out", "op"] == "aten.copy_.default" and mine.loc["out", "count"] == 3
        assert mine.loc["out", "to_format"] == "channels_last"


def test_a_hanging_rank_ends_in_bounded_time(tmp_path):
    res = launch("hang", tmp_path, deadline_s=60)
    assert not res["timed_out"] and res["seconds"] < 60
    assert res["codes"][0] not in (0, None) and "Timed out" in res["log"], res["log"]
    assert res["codes"][1] == -signal.SIGKILL  # still asleep: killed when rank 0 failed
    assert _pids_with(res["token"]) == []


def test_example_under_torchrun(tmp_path):
    """The README's command: torchrun starts the ranks (with its own rendezvous on localhost)."""
    token = uuid.uuid4().hex
    out = tmp_path / "ddp_audit"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
           str(EXAMPLE), "--out", str(out), "--plant-rank", "1", "--timeout", "60"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", TOKEN_VAR: token,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        text, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
    finally:
        _kill(token)  # torchrun puts its workers in sessions of their own
    assert _pids_with(token) == []
    assert proc.returncode == 0, text[-4000:]
    assert "Hotspots differ between ranks" in text and " mid " in text
    assert "have their parameter's format" in text
    for name in ("audit.rank0.csv", "audit.rank1.csv", "report.txt", "hotspots.csv",
                 "differences.csv", "bucket_hotspots.csv", "grads.csv"):
        assert (out / name).exists(), name


def test_single_process_audit_has_no_buckets_and_grads_are_checked():
    import torch

    import auditor
    from auditor.distributed import bucket_hotspots, bucket_ops, check_grad_formats

    ex = _load_example()
    model = ex.Net().to(memory_format=torch.channels_last)
    x, y = ex.make_batch(0, 0)
    a = auditor.audit(model, x)
    assert bucket_ops(a).empty and bucket_hotspots(a).empty
    assert set(a.events["rank"]) == {0} and set(a.events["world_size"]) == {1}
    assert check_grad_formats(model)["ok"].all()
    model.conv2.weight.grad = model.conv2.weight.grad.contiguous()  # breaks the layout contract
    g = check_grad_formats(model).set_index("parameter")
    assert not g.loc["conv2.weight", "ok"] and not g.loc["conv2.weight", "same_strides"]
    assert g.drop(index="conv2.weight")["ok"].all()


def test_merge_rejects_missing_and_duplicate_ranks(run, tmp_path):
    import shutil

    from auditor.distributed import merge_rank_audits
    from auditor.distributed._files import rank_path

    assert rank_path(tmp_path, 3) == str(tmp_path / "audit.rank3.csv")
    assert rank_path("x/run.csv", 1) == "x/run.rank1.csv"
    assert rank_path("x/{rank}/a.csv", 2) == "x/2/a.csv"
    shutil.copy(run["out"] / "same" / "audit.rank0.csv", tmp_path / "audit.rank0.csv")
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\]"):
        merge_rank_audits(tmp_path)
    assert merge_rank_audits(tmp_path, allow_missing=True).ranks == [0]
    shutil.copy(run["out"] / "same" / "audit.rank0.csv", tmp_path / "audit.rank1.csv")
    with pytest.raises(ValueError, match="file name says rank 1"):
        merge_rank_audits(tmp_path)


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
