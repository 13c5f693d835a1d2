"""Time: the profiler's kernel time per op, the copies inside ops, recording-mode artifacts,
rankings by time, and the Chrome trace."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
import torch.nn as nn
from planted import make

import auditor
from auditor._session import PLAIN_STEPS

CL = torch.channels_last


@pytest.fixture(scope="module")
def softmax_timed():
    model, x = make("softmax")
    return auditor.audit(model, x, warmup=1)


def test_audit_times_every_op_by_default(softmax_timed):
    ev = softmax_timed.events
    assert ev["time_us"].notna().all() and (ev["time_us"] >= 0).all()
    assert ev["start_us"].notna().all() and ev["start_us"].is_monotonic_increasing
    assert ev["gap_us"].notna().all()
    model, x = make("softmax")
    untimed = auditor.audit(model, x, record_time=False)
    assert untimed.events["time_us"].isna().all() and untimed.events["duration_us"].isna().all()
    assert untimed.hidden.empty
    with auditor.FormatAuditor(record_time=True, profile=False) as fa:
        model(x)
    assert fa.audit.events["time_us"].isna().all() and fa.audit.events["duration_us"].notna().all()


class ManySmallOps(nn.Module):
    """A convolution, then many tiny elementwise ops: the recorder's Python costs each of them
    several times its kernel."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        for _ in range(100):
            y = y + 1
        return y


def _plain_add_us(model, x) -> float:
    """The median time of the step's adds under the profiler alone (no mode)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x)
    return statistics.median(e.cpu_time_total for e in prof.events() if e.cpu_parent is None and e.name == "aten::add")


def test_kernel_times_leave_out_the_recorders_own_python():
    """time_us is the op's kernels: for tiny ops it stays near what the profiler measures
    without any mode, while the wall time around each op inside the mode is longer. Medians
    (a preempted op does not move them) of runs made back to back, paired per round."""
    torch.manual_seed(0)
    model = ManySmallOps()
    x = torch.randn(1, 3, 8, 8)
    for _ in range(3):
        model(x)
    ratios, overheads = [], []
    for _ in range(5):
        plain = _plain_add_us(model, x)
        with torch.no_grad():
            a = auditor.audit(model, x, backward=False)
        adds = a.events[a.events["op"] == "aten.add.Tensor"]
        ratios.append(float(adds["time_us"].median()) / plain)
        overheads.append(float((adds["duration_us"] - adds["time_us"]).median()))
    assert statistics.median(ratios) < 2.0, ratios
    assert statistics.median(overheads) > 0  # the wall time around an op inside the mode is more than its kernels


def test_copies_inside_kernels_are_hidden_conversions(softmax_timed):
    h = softmax_timed.hidden
    ops = softmax_timed.events["op"].astype(str).to_numpy()
    softmax = h[[ops[s] == "aten._softmax.default" for s in h["seq"]]]
    assert len(softmax) == 1
    row = softmax.iloc[0]
    assert (row["kind"], row["from_format"], row["to_format"], row["arg"]) == (
        "format", "channels_last", "contiguous", "self")
    assert row["bytes"] == 2 * 8 * 8 * 8 * 4 and row["time_us"] > 0
    # the copy lies in its op's slot of the recorded timeline: after the op began, before the next
    # one did (time_us is the op's time without the recorder, no longer its span on that timeline),
    # and it took no longer than the op
    seq = int(row["seq"])
    start = softmax_timed.events.at[seq, "start_us"]
    assert start <= row["start_us"] < softmax_timed.events.at[seq + 1, "start_us"]
    assert row["time_us"] <= softmax_timed.events.at[seq, "time_us"] * 1.001


def test_a_torch_whose_profiler_does_not_record_mode_calls_times_every_op_alike(monkeypatch, softmax_timed):
    """Where the profiler makes no record of each call of a dispatch mode (torch before 2.10),
    the recorder makes it: every op is timed and the copies inside kernels are found, as with
    torch's own record (here both nest, which the join reads through)."""
    from auditor import _session

    monkeypatch.setattr(_session, "profiler_records_mode_calls", lambda: False)
    model, x = make("softmax")
    marked = auditor.audit(model, x, warmup=1)
    ev = marked.events
    assert ev["time_us"].notna().all() and (ev["time_us"] >= 0).all()
    assert ev["start_us"].is_monotonic_increasing
    assert list(ev["op"]) == list(softmax_timed.events["op"])
    columns = ["seq", "via", "arg", "kind", "from_format", "to_format", "bytes"]
    assert marked.hidden[columns].equals(softmax_timed.hidden[columns])


def test_a_weight_in_the_other_format_is_copied_inside_the_convolution():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1).to(memory_format=CL)
    conv.weight.data = conv.weight.data.contiguous()
    x = torch.randn(2, 8, 8, 8).to(memory_format=CL)
    a = auditor.audit(conv, x)
    h = a.hidden
    forward = h[h["seq"] == 0]
    assert ("weight", "format", "contiguous", "channels_last") in set(
        zip(forward["arg"], forward["kind"], forward["from_format"], forward["to_format"]))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        return self.c(torch.relu(self.b(y)) + y)


def test_out_of_place_gradient_sums_are_marked_and_never_causes():
    torch.manual_seed(0)
    model = Residual().to(memory_format=CL)
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    a = auditor.audit(model, x)
    ev = a.events
    marked = ev[ev["artifact"]]
    assert len(marked) == 1 and (marked["op"] == "aten.add.Tensor").all() and (marked["phase"] == "backward").all()
    assert not ev.loc[(ev["phase"] == "forward"), "artifact"].any()  # the forward add is the model's own
    # the plain run sums in place, as the profiler sees it
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    engine = [e for e in prof.events() if e.name == "aten::add_" and e.cpu_parent is not None
              and e.cpu_parent.name.startswith("autograd::engine::evaluate_function")]
    assert len(engine) == len(marked)
    causes = a.causes()
    assert not set(zip(causes["op"], causes["phase"])) & {("aten.add.Tensor", "backward")}


def test_times_rank_the_causes_and_hotspots(softmax_timed):
    causes = softmax_timed.causes()
    assert causes["time_us"].notna().all() and (causes["saving_us"] >= 0).all()
    assert causes["saving_us"].is_monotonic_decreasing
    hot = softmax_timed.hotspots()
    assert hot["time_us"].notna().all() and hot["time_us"].is_monotonic_decreasing
    summary = softmax_timed.summary()
    assert summary["time_us"].notna().all()
    text = softmax_timed.report()
    assert "most time saved first" in text and "time outside ops" in text
    # a step this small (a few kB) is timed by per-call costs: the report gives the reason, not a
    # number (tests/test_estimate.py shows the number for a step big enough)
    assert "no estimate of what a fix saves: a tiny step" in text and "a fix saves about" not in text
    lines = text.splitlines()
    assert len(lines) <= 40 and max(len(line) for line in lines) <= 130


def test_a_fix_saves_at_most_what_its_cause_and_symptoms_cost(softmax_timed):
    c = softmax_timed.causes()
    assert (c["saving_us"] <= c["time_us"] + 1e-9).all()


def test_chrome_trace_is_valid_and_links_causes_to_symptoms(softmax_timed, tmp_path):
    path = tmp_path / "trace.json"
    softmax_timed.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] in ("ms", "ns")
    for e in events:
        assert {"ph", "pid", "name"} <= set(e), e
        if e["ph"] == "X":
            assert {"ts", "dur", "tid", "cat", "args"} <= set(e) and e["dur"] >= 0 and math.isfinite(e["ts"])
        if e["ph"] == "M":
            assert "name" in e["args"] or "sort_index" in e["args"]
        if e["ph"] in ("s", "f"):
            assert {"id", "ts", "tid", "cat"} <= set(e)
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "hidden"]
    assert len(ops) == len(softmax_timed.events)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"forward", "backward"} <= names
    assert {e["args"]["kind"] for e in ops} >= {"loses", "converts", "preserves"}
    # hidden copies lie inside their op's slice
    by_seq = {e["args"]["seq"]: e for e in ops}
    hidden = [e for e in events if e["ph"] == "X" and e["cat"] == "hidden"]
    assert len(hidden) == len(softmax_timed.hidden)
    for h in hidden:
        op = by_seq[h["args"]["seq"]]
        assert op["tid"] == h["tid"] and op["ts"] <= h["ts"] and h["ts"] + h["dur"] <= op["ts"] + op["dur"] + 1e-6
    # one arrow per symptom, from the cause's slice to the symptom's
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys() and len(starts) == softmax_timed.causes()["hotspots"].sum() - 1

    def enclosing(flow):
        return [o for o in ops if o["tid"] == flow["tid"] and o["ts"] <= flow["ts"] <= o["ts"] + o["dur"]]

    for k in starts:
        (source,) = enclosing(starts[k])
        (target,) = enclosing(finishes[k])
        assert source["name"] == "aten._softmax.default" and target["args"]["cause"] == 1
        assert target["args"]["hotspot"]


def test_an_untimed_audit_still_makes_a_trace():
    model, x = make("softmax")
    trace = auditor.audit(model, x, record_time=False).chrome_trace()
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in ops] == sorted(e["ts"] for e in ops) and all(e["dur"] == 1.0 for e in ops)


def test_a_running_profiler_is_left_alone():
    model, x = make("softmax")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a = auditor.audit(model, x)
    assert any(e.name == "aten::_softmax" for e in prof.events())  # the user's session kept its events
    assert a.events["time_us"].isna().all() and a.events["duration_us"].notna().all()


def _ops(*rows):
    """A minimal analysed event frame: (op, kind, hotspot, is_conv, bytes, time_us) per event."""
    import pandas as pd

    return pd.DataFrame(rows, columns=["op", "kind", "hotspot", "is_conv", "bytes", "time_us"])


def test_what_a_fix_saves_on_each_kind_of_symptom():
    import numpy as np
    import pandas as pd

    from auditor._analysis import _costs as timing

    ops = _ops(
        ("aten.clone.default", "converts", True, False, 1000, 50.0),  # a copy: all of it
        ("aten.convolution.default", "preserves", True, True, 1000, 400.0),  # its inner copy only
        ("aten.add.Tensor", "converts", True, False, 1000, 30.0),  # less a same-format add's time
        ("aten.add.Tensor", "preserves", False, False, 4000, 40.0),  # that: 10 µs per 1000 B
        ("aten.sum.dim_IntList", "loses", True, False, 1000, 80.0),  # writes it itself: its own op
        ("aten.relu.default", "preserves", False, False, 1000, 5.0),  # no hotspot: nothing
    )
    result = np.array([1000, 1000, 1000, 4000, 1000, 1000], dtype=float)
    hidden = pd.DataFrame({
        "seq": [1, 1, 4], "kind": ["format", "materialize", "materialize"], "time_us": [20.0, 7.0, 3.0],
        "bytes": [1000, 1000, 1000], "from_format": ["contiguous", "ambiguous_view", "channels_last_view"],
        "to_format": ["channels_last", "channels_last", "contiguous"]})
    # a broadcast made dense (ambiguous) is no format copy; a channels_last view made contiguous is
    assert timing.format_copies(hidden).tolist() == [True, False, True]
    cost = timing.CopyCost(call_us=2.0, byte_us=0.01)
    assert timing.saving_us(ops, hidden, result, cost).tolist() == [50.0, 20.0, 20.0, 0.0, 3.0, 0.0]
    # without profiled inner copies, a convolution's permute costs a copy of its bytes
    assert timing.saving_us(ops, hidden.iloc[:0], result, cost).tolist() == [50.0, 12.0, 20.0, 0.0, 0.0, 0.0]
    untimed = ops.assign(time_us=float("nan"))
    assert all(math.isnan(v) for v in timing.saving_us(untimed, hidden.iloc[:0], result, None))

    # the cause's own ops: what its pattern's fix puts in their place
    assert timing.own_saving_us(ops, hidden, "no_cl_kernel", [4], [1000], cost) == 3.0  # its inner copies
    assert timing.own_saving_us(ops, hidden, "stack_reduce", [4], [2000], cost) == pytest.approx(80.0 - 22.0)
    assert timing.own_saving_us(ops, hidden, "nc11_broadcast", [4], [8000], cost) == 3.0  # never below its copies
    assert timing.own_saving_us(ops, hidden, "loses", [4], [1000], cost) == pytest.approx(3.0 - 12.0)  # a copy after
    assert timing.own_saving_us(ops, hidden, "stack_reduce", [], [], cost) == 0.0
    assert math.isnan(timing.own_saving_us(untimed, hidden, "loses", [4], [1000], None))


def test_the_cost_of_a_copy_is_fitted_to_the_audits_own_copies():
    import numpy as np
    import pandas as pd

    from auditor._analysis import _costs as timing

    sizes = [1000, 2000, 4000, 8000]
    ops = _ops(*[("aten.clone.default", "preserves", False, False, 0, 5.0 + 0.002 * b) for b in sizes],
               ("aten.relu.default", "preserves", False, False, 0, 99.0))
    result = np.array([*sizes, 1000], dtype=float)
    cost = timing.copy_cost(ops, pd.DataFrame(columns=["bytes", "time_us"]), result)
    assert cost.call_us == pytest.approx(5.0) and cost.byte_us == pytest.approx(0.002)
    assert cost(0) == 0.0 and cost.passes([1000, 1000]) == pytest.approx(14.0)
    assert timing.copy_cost(ops.assign(time_us=float("nan")), None, result) is None


def test_a_timed_audit_warms_up_once_and_records_the_step_a_fresh_model_takes():
    """warmup defaults to one step when timed; the warm-up gives the gradients back, so the
    recorded backward stores fresh gradients as the first one would (it does not add into
    the warm-up's) and the recorded ops are those of warmup=0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    x = torch.randn(2, 3, 8, 8)
    cold = auditor.audit(model, x, warmup=0)
    model.zero_grad(set_to_none=True)
    calls = []
    hook = model[0].register_forward_hook(lambda *_: calls.append(1))
    warm = auditor.audit(model, x)
    hook.remove()
    # the warm-up, the steps timed without the recorder (plain, profiled alone, plain), then the
    # recorded step
    assert len(calls) == 1 + PLAIN_STEPS + 1 + 1
    assert list(warm.events["op"]) == list(cold.events["op"])
    assert all(p.grad is not None for p in model.parameters())  # the recorded step's gradients
    untimed = []
    hook = model[0].register_forward_hook(lambda *_: untimed.append(1))
    auditor.audit(model, x, record_time=False)
    hook.remove()
    assert len(untimed) == 1



def test_time_off_the_cpu_is_not_kernel_time(monkeypatch):
    """The profiler's clock is the wall's: an op that waits for the CPU while another process
    holds it would count the wait. time_us is the process CPU time around the call where that
    is less. Here the process clock stands still (as if every op had waited the whole time):
    no op keeps a time; with the real clock the ops keep the profiler's time."""
    x = torch.randn(256, 256)

    def model(t):
        return (t.exp() + t).sin()

    real = auditor.audit(model, x, backward=False)
    assert (real.events["time_us"] > 0).all()
    from auditor._recording import _mode

    monkeypatch.setattr(_mode, "_process_time_ns", lambda: 0)
    waited = auditor.audit(model, x, backward=False)
    assert (waited.events["duration_us"] > 0).all()
    assert (waited.events["time_us"] == 0).all()
    assert _mode.on_cpu([5, -1, 7], [9, 3, 2]) == [5, -1, 2]


def test_a_timed_audits_last_warm_up_runs_under_the_profiler():
    """The recorded step runs under torch's profiler, whose records take memory the plain step
    never touched; the last warm-up step runs under it too, so that memory is mapped before the
    recorded step (its page faults read as op time in a process's first audit). An untimed
    audit's warm-up runs without it, and so do the timed audit's earlier warm-up steps."""
    profiled = []

    class Probe(nn.Module):
        def forward(self, t):
            profiled.append(torch._C._autograd._profiler_enabled())
            return t * 2

    x = torch.randn(2, 3, requires_grad=True)
    auditor.audit(Probe(), x, warmup=3)
    # two plain warm-ups, the profiled one, the step timed without the recorder (plain, under the
    # profiler alone, plain), the recorded step
    assert profiled == [False, False, True, False, True, False, True]
    profiled.clear()
    auditor.audit(Probe(), x, warmup=2, record_time=False)
    assert profiled == [False, False, False]
