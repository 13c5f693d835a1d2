"""The estimate of what a fix saves (``causes()["saving_us"]``): what a fix removes, what it puts
in place, whether the estimate can be trusted and why it is 0, and that repeated audits agree."""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
from planted import CAUSE_MODELS, make_cause

import auditor
from auditor._analysis import _costs as costs

CL = torch.channels_last


def _ops(*rows):
    """(op, kind, hotspot, is_conv, bytes, time_us) per event."""
    return pd.DataFrame(rows, columns=["op", "kind", "hotspot", "is_conv", "bytes", "time_us"])


def _scaled(name: str):
    """A planted-cause model with an input big enough to time (as benchmarks/savings.py scales it)."""
    shape = CAUSE_MODELS[name][1]
    grow = 8 if len(shape) == 4 else 4
    batch = 1 if shape[0] == 1 else 16
    return make_cause(name, shape=(batch, shape[1], *shape[2:-2], shape[-2] * grow, shape[-1] * grow))


def test_a_copy_the_same_op_makes_where_the_format_is_kept_stays_after_a_fix():
    """A convolution's backward that converts its weight gradient into the weight's format does
    so in every call, hotspot or not: a fix removes the copy of its input, not that one."""
    ops = _ops(
        ("aten.convolution_backward.default", "converts", True, True, 1000, 400.0),
        ("aten.convolution_backward.default", "preserves", False, True, 1000, 380.0),
    )
    hidden = pd.DataFrame({
        "seq": [0, 0, 1], "arg": ["input", "(internal)", "(internal)"], "kind": ["format"] * 3,
        "time_us": [20.0, 90.0, 85.0], "bytes": [1000, 9000, 9000],
        "from_format": ["contiguous"] * 3, "to_format": ["channels_last"] * 3})
    # (a call that is no hotspot keeps its copies: a cause's own op, which a fix replaces)
    assert costs.removable_copies(hidden, ops).tolist() == [True, False, True]
    result = np.array([1000.0, 1000.0])
    assert costs.saving_us(ops, hidden, result, costs.CopyCost(0.0, 0.01)).tolist() == [20.0, 0.0]
    # with no call that keeps the format to compare with, every format copy counts
    alone = ops.assign(hotspot=True)
    assert costs.removable_copies(hidden, alone).tolist() == [True, True, True]


def test_a_pass_costs_what_the_steps_own_format_keeping_ops_of_its_size_take():
    """The median µs per byte of the ops of about its size: one slow call does not set it, and
    far sizes do not count while near ones exist."""
    cost = costs.PassCost(np.array([1000.0, 1000.0, 1100.0, 900.0, 1000.0, 64000.0]),
                          np.array([1.0, 1.0, 1.1, 0.9, 50.0, 640.0]))
    assert cost(2000) == pytest.approx(2.0)  # 1 ns per byte, the 50 µs call aside
    assert cost(0) == 0.0 and cost.passes([1000, 1000]) == pytest.approx(2.0)
    assert cost(64000) == pytest.approx(64.0)  # the nearest five, the median rate
    ops = _ops(("aten.add.Tensor", "preserves", False, False, 0, 3.0))
    assert costs.pass_cost(ops, np.array([0]), [3000.0])(6000) == pytest.approx(6.0)
    # a fix that is one pass is priced as a pass; a copy after the op changes the format: a copy
    own = _ops(("aten.sum.dim_IntList", "loses", True, False, 1000, 80.0))
    copy = costs.CopyCost(call_us=2.0, byte_us=0.01)
    assert costs.own_saving_us(own, None, "stack_reduce", [0], [2000], copy, cost) == pytest.approx(78.0)
    assert costs.own_saving_us(own, None, "stack_reduce", [0], [2000], copy) == pytest.approx(58.0)
    assert costs.own_saving_us(own, None, "loses", [0], [1000], copy, cost) == pytest.approx(-12.0)
    assert costs.pass_cost(ops.assign(time_us=float("nan")), np.array([0]), [3000.0]) is None


def test_an_op_on_a_stacked_tensor_is_not_absorbed_into_the_fixs_pass():
    """A stack a reduction alone reads is absorbed by the one pass of the fix; a weighting of
    the stacked tensor (x * attn, then the sum) is work the fix still does per branch."""

    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.out = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 1)
            self.w = nn.Parameter(torch.rand(2, 8, 1, 1))

        def forward(self, x):
            stacked = torch.stack([self.a(x), self.b(x)], 1)
            return self.out((stacked * self.w).sum(1))

    class Plain(Weighted):
        def forward(self, x):
            return self.out(torch.stack([self.a(x), self.b(x)], 1).sum(1))

    def replaced_ops(cls):
        torch.manual_seed(0)
        model = cls().to(memory_format=CL)
        a = auditor.audit(model, torch.randn(2, 4, 8, 8).to(memory_format=CL), record_time=False)
        an = a.analysis()
        cause = a.causes().iloc[0]
        assert cause["pattern"] == "stack_reduce"
        own, _ = an.tracer.replaced([int(cause["first_seq"])], "stack_reduce")
        return set(an.ops["op"].astype(str).to_numpy()[own])

    assert "aten.stack.default" in replaced_ops(Plain)
    weighted = replaced_ops(Weighted)
    assert "aten.mul.Tensor" not in weighted and "aten.stack.default" not in weighted


def test_an_estimate_says_when_it_cannot_be_trusted():
    """A tiny step, a step with no warm-up, no times: saving_trusted is False and saving_note
    says why; the report says so instead of the number. A step big enough to time is trusted."""
    model, x = make_cause("stack_reduce")
    tiny = auditor.audit(model, x).causes()
    assert not tiny["saving_trusted"].any()
    assert tiny["saving_note"].str.startswith("a tiny step").all()
    big_model, big_x = _scaled("stack_reduce")
    warm = auditor.audit(big_model, big_x)
    assert warm.causes()["saving_trusted"].all() and (warm.causes()["saving_note"] == "").all()
    assert "a fix saves about" in warm.report()
    cold = auditor.audit(big_model, big_x, warmup=0)
    assert not cold.causes()["saving_trusted"].any()
    assert cold.causes()["saving_note"].str.contains("warmup=0").all()
    assert "a fix saves about" not in cold.report() and "no estimate of what a fix saves" in cold.report()
    assert "about the estimate" in cold._repr_html_()
    untimed = auditor.audit(big_model, big_x, record_time=False).causes()
    assert not untimed["saving_trusted"].any() and (untimed["saving_note"] == "not timed").all()
    back = auditor.Audit.read_csv(warm.to_csv()).causes()  # the log round-trips; the estimate is its own
    assert list(back.columns) == list(warm.causes().columns)


def test_an_estimate_that_rests_on_one_outlier_call_is_not_trusted():
    ops = _ops(*[("aten.sum.dim_IntList", "loses", True, False, 1000, 10.0)] * 4,
               ("aten.sum.dim_IntList", "loses", True, False, 1000, 900.0),
               ("aten.convolution.default", "preserves", False, True, 1000, 2000.0))
    size = np.full(len(ops), 1e6)
    trusted, note = costs.estimate_note(ops, size, {0: 10.0, 1: 10.0, 4: 900.0}, 920.0, 5)
    assert not trusted and "one call of sum.dim_IntList" in note and "90x" in note
    # the same time spread over calls like it is no outlier
    assert costs.estimate_note(ops, size, {0: 10.0, 1: 10.0, 2: 10.0}, 30.0, 5) == (True, "")
    # a call slow because its operands came in other formats is compared with calls like it
    mixed = ops.assign(kind=["preserves"] * 4 + ["converts", "preserves"])
    assert costs.estimate_note(mixed, size, {0: 10.0, 4: 900.0}, 910.0, 5) == (True, "")


def test_a_cause_with_hotspots_is_never_estimated_at_0_without_a_reason():
    ops = _ops(("aten.sum.dim_IntList", "loses", True, False, 1000, 10.0),
               ("aten.convolution.default", "preserves", False, True, 1000, 2000.0))
    trusted, note = costs.estimate_note(ops, np.full(2, 1e6), {0: 10.0}, 0.0, 3)
    assert trusted and note.startswith("0: ")
    for name in ("stack_reduce", "se_mean", "weight_rebuilt", "conv3d_batch1"):
        causes = auditor.audit(*_scaled(name)).causes()
        zero = causes[(causes["saving_us"] == 0) & (causes["hotspots"] > 0)]
        assert (zero["saving_note"] != "").all(), zero


def test_repeated_audits_give_the_same_estimate():
    """The same model audited five times: every estimate within 2x of their median (the
    profiler's wall clock once made one cause 545 to 1461 µs, another 900 to 5000 µs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, x = _scaled("stack_reduce")
        estimates = [float(auditor.audit(model, x).causes()["saving_us"].sum()) for _ in range(5)]
    finally:
        torch.set_num_threads(before)
    mid = statistics.median(estimates)
    assert mid > 0
    assert all(0.5 * mid <= e <= 2 * mid for e in estimates), estimates


def _causes(*rows):
    """(cause, time_us, saving_us, saving_trusted, saving_note) per cause."""
    return pd.DataFrame(rows, columns=["cause", "time_us", "saving_us", "saving_trusted", "saving_note"])


def test_no_saving_exceeds_the_time_of_what_it_removes():
    """Constructed: a cause whose estimate (900 µs) is more than its ops take (500 µs) is cut to
    them and not trusted, and says why; one within its ops is left as it is."""
    ops = pd.DataFrame({"time_us": [100.0, 500.0], "start_us": [0.0, 200.0]})
    causes = _causes((1, 500.0, 900.0, True, ""), (2, 500.0, 400.0, True, ""))
    out = costs.within_step(causes, ops)
    assert out["saving_us"].tolist() == [500.0, 400.0]
    assert out["saving_trusted"].tolist() == [False, True]
    assert "more than the 500 µs its ops take" in out["saving_note"][0] and out["saving_note"][1] == ""


def test_no_time_is_shown_for_ops_that_add_up_to_more_than_the_step():
    """Constructed: two ops of 600 µs each inside a step that spans 700 µs (they overlap, as ops
    timed on several threads would): no estimate is trusted, and the report's head gives the
    reason instead of an ops time."""
    ops = pd.DataFrame({"time_us": [600.0, 600.0], "start_us": [0.0, 100.0]})
    assert costs.step_us(ops) == 700.0
    assert "more than the 0.7 ms the step took" in costs.times_note(ops)
    out = costs.within_step(_causes((1, 600.0, 300.0, True, "")), ops)
    assert not out["saving_trusted"].any() and "more than the 0.7 ms" in out["saving_note"][0]
    from auditor._display._report import _time_lines
    line = _time_lines(ops.assign(hotspot=[True, False]), out, threads=1)[0]
    assert "not shown" in line and "ms, of which" not in line and "at 1 thread, process CPU time" in line
    sane = pd.DataFrame({"time_us": [300.0, 300.0], "start_us": [0.0, 400.0]})
    assert costs.times_note(sane) == ""


def test_a_timed_audit_measures_at_one_thread_and_gives_the_callers_count_back():
    """The timed step and its warm-up run at one intra-op thread (as Fixes.verify times), the
    Audit and its report say so, and the caller's count is back afterwards, also when the model
    raises; an untimed audit runs at the caller's count."""
    seen = []

    class Probe(nn.Module):
        def __init__(self, fail=False):
            super().__init__()
            self.conv, self.fail = nn.Conv2d(3, 4, 3), fail

        def forward(self, x):
            seen.append(torch.get_num_threads())
            if self.fail:
                raise KeyError("boom")
            return self.conv(x)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1, 3, 8, 8)
        a = auditor.audit(Probe(), x)
        # the warm-up, the three steps timed without the recorder, the recorded step
        assert seen == [1] * 5 and torch.get_num_threads() == 2 and a.threads == 1
        assert "at 1 thread, process CPU time" in a.report()
        seen.clear()
        with pytest.raises(KeyError):
            auditor.audit(Probe(fail=True), x)
        assert seen == [1] and torch.get_num_threads() == 2
        seen.clear()
        assert auditor.audit(Probe(), x, record_time=False).threads is None and seen == [2]
    finally:
        torch.set_num_threads(before)


def test_a_causes_estimate_counts_the_format_copies_inside_its_symptoms():
    """A softmax over the channels between two convolutions (the README's quick start): both
    convolutions permute the softmax's contiguous map inside their kernels (``Audit.hidden``),
    and the estimate holds at least those copies. It once read 0 s, because the pipeline
    handed the hidden copies to the cause table as its facts."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.Softmax(dim=1),
                              nn.Conv2d(32, 32, 3, padding=1)).to(memory_format=CL)
        a = auditor.audit(model, torch.randn(4, 3, 32, 32).to(memory_format=CL))
    finally:
        torch.set_num_threads(before)
    ops, hidden, causes = a.ops(), a.hidden, a.causes()
    assert len(causes) == 1
    symptoms = ops["hotspot"].to_numpy() & ops["is_conv"].to_numpy().astype(bool)
    removed = hidden[costs.removable_copies(hidden, ops) & symptoms[hidden["seq"].to_numpy()]]
    assert len(removed) >= 2, hidden
    assert causes.at[0, "saving_us"] >= removed["time_us"].sum() > 0
