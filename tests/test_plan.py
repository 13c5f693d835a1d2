"""Layout plans that know their noise: paired rounds until a decision is clear, one decision per
convolution signature, within-noise decisions that keep the uniform default, keyword inputs,
progress bars."""

from __future__ import annotations

import random
import re
import warnings

import pytest
import torch
import torch.nn as nn

import auditor
from auditor import _measure as measure
from auditor import _plan as plan
from auditor._display import progress
from auditor._measure import _decide as decide
from auditor._measure import _harness
from auditor._plan import _cut as cut
from auditor._plan import _layout as layout


class Twins(nn.Module):
    """A stem, then two convolutions with one signature (same shapes, weights, stride...)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(torch.relu(self.stem(x))))).mean((2, 3))


class Shifted(nn.Module):
    """Takes a required keyword-only tensor."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x, *, shift, scale=1.0):
        return self.head(torch.relu(self.stem(x) + shift)) * scale


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(plan._measure, "SAMPLE_US", 200.0)
    monkeypatch.setattr(plan._measure, "MODEL_SAMPLE_US", 400.0)
    monkeypatch.setattr(progress, "ENABLED", False)


def fake_timer(monkeypatch, times):
    """Replace the timer: ``times(name)`` gives a sample's µs for the candidate ``name``
    (``contiguous``/``channels_last`` for a convolution or a conversion, ``all contiguous``,
    ``all channels_last``, ``planned`` end to end). Returns the names sampled."""
    seen = []

    def sample(name, fn, number, device):
        seen.append(name)
        t = times(name)
        return t, t, 0.0

    monkeypatch.setattr(measure._harness, "sample", sample)
    return seen


def _frame(p):
    return p.convs.set_index("module")


# -- the statistics -------------------------------------------------------------------------------


def test_median_interval_is_the_order_statistics_of_the_binomial():
    assert decide.median_interval([5, 1, 4, 2, 3, 7, 6]) == (1, 7)  # n=7: smallest to largest (98.4%)
    assert decide.median_interval(list(range(14))) == (2, 11)  # n=14: the 3rd and 12th (98.7%)
    assert decide.median_interval(list(range(35))) == (10, 24)  # n=35: the 11th and 25th (98.3%)
    assert decide.median_interval([2.0]) == (2.0, 2.0)


def test_decide_needs_a_clear_interval_on_one_side_of_the_margin():
    assert decide.decide([0.5] * 7, 0.02).verdict == decide.ALTERNATIVE
    assert decide.decide([1.0] * 7, 0.02).verdict == decide.DEFAULT  # not 2% faster, clearly
    assert decide.decide([0.5] * 6, 0.02).within_noise  # too few rounds for an interval
    noisy = decide.decide([0.7, 1.3, 0.9, 1.1, 0.95, 1.05, 0.8], 0.02)
    assert noisy.within_noise and noisy.repeats == 7 and noisy.low < 0.98 < noisy.high


def test_tied_convolutions_get_one_label_from_the_cut():
    unary = {"a": {"contiguous": 10.0, "channels_last": 0.0}, "b": {"contiguous": 0.0, "channels_last": 3.0}}
    assert cut.min_cut(["a", "b"], unary, {}) == {"a": "channels_last", "b": "contiguous"}
    assert cut.min_cut(["a", "b"], unary, {}, [["a", "b"]]) == {"a": "channels_last", "b": "channels_last"}


def test_rounds_keep_their_samples_and_take_more():
    r = _harness.Rounds({"x": lambda: sum(range(50)), "y": lambda: sum(range(100))}, min_sample_us=50)
    r.run(3)
    assert len(r) == 3 and len(r.times("cpu")["y"]) == 3
    r.run(2)
    assert len(r) == 5 and list(r.frame().index) == ["x", "y"]


def test_rounds_alternate_their_order(monkeypatch):
    seen = fake_timer(monkeypatch, lambda name: 1.0)
    r = _harness.Rounds({"x": lambda: None, "y": lambda: None, "z": lambda: None}, min_sample_us=0)
    r.run(1).run(2)
    assert seen == ["x", "y", "z", "z", "y", "x", "x", "y", "z"]


# -- plan_layout ------------------------------------------------------------------------------------


def test_same_signature_convolutions_share_one_measurement_and_one_verdict(fast, monkeypatch):
    # the ops after `a` favour channels_last, those after `b` contiguous: measured apart, the
    # two would get opposite verdicts; they have one signature, so one decision for both
    fake_timer(monkeypatch, lambda name: 100.0)
    real_ops = layout.ops_between_convs

    def ops(*args, **kwargs):
        out = real_ops(*args, **kwargs)
        out["contiguous"].update(stem=0.0, a=60.0, b=0.0)
        out["channels_last"].update(stem=0.0, a=0.0, b=40.0)
        return out
    monkeypatch.setattr(layout, "ops_between_convs", ops)
    made = []
    real_rounds = layout.conv_rounds

    def rounds(*args, **kwargs):
        sigs, r = real_rounds(*args, **kwargs)
        made.append(r)
        return sigs, r
    monkeypatch.setattr(layout, "conv_rounds", rounds)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", auditor.NoisyPlanWarning)
        p = auditor.plan_layout(Twins().eval(), torch.randn(2, 3, 10, 10))
    assert len(made[0]) == 2, "one measurement for the stem, one shared by a and b"
    c = _frame(p)
    assert c.at["a", "group"] == c.at["b", "group"] != c.at["stem", "group"]
    for col in ("ratio", "ratio_low", "ratio_high", "repeats", "within_noise", "proposed", "format"):
        assert c.at["a", col] == c.at["b", col], col
    assert c.at["a", "ratio"] == pytest.approx((200 + 40) / (200 + 60))  # the group's totals
    assert "(2 convolutions, one signature)" in c.at["a", "reason"]


def test_a_decision_within_noise_is_marked_and_keeps_the_uniform_default(fast, monkeypatch):
    rng = random.Random(0)
    # every sample of every candidate drawn alike: no real difference, ±50% noise (µs large
    # enough that the real ops after each convolution, timed by the audits, do not count)
    fake_timer(monkeypatch, lambda name: 1e5 * rng.lognormvariate(0.0, 0.5))
    torch.manual_seed(0)
    with pytest.warns(auditor.NoisyPlanWarning, match="within noise"):
        p = auditor.plan_layout(Twins().eval(), torch.randn(2, 3, 10, 10), repeats=5, max_repeats=20)
    c = _frame(p)
    assert p.default == "contiguous"  # a freshly built model
    assert c.at["a", "within_noise"] and c.at["a", "repeats"] == 20
    assert c.at["a", "ratio_low"] < 0.98 < c.at["a", "ratio_high"]
    assert "within noise" in c.at["a", "reason"]
    assert set(p.formats.values()) == {"contiguous"} and p.chosen == "all contiguous"
    assert p.within_noise
    cand = p.candidates.set_index("candidate")
    assert cand.at["all channels_last", "within_noise"] is True
    assert cand.at["all channels_last", "repeats"] == 20
    text = str(p)
    assert "within noise" in text and "rounds" in text and "[98% interval]" in text
    assert repr(p) == text
    decisions = p.decisions()
    assert list(decisions["convolutions"]).count("a +1") == 1 and decisions["within_noise"].any()
    html = p._repr_html_()  # a notebook: the headline with the noise note, then two tables
    assert html.count("<table") == 2 and "Candidates" in html and "a +1" in html
    assert "note: within noise against a 2% margin" in html and "<pre>" not in html


def test_a_clear_decision_is_taken_with_few_repeats(fast, monkeypatch):
    # channels_last twice as fast everywhere: every decision is clear after the first rounds
    # (µs large enough that the real ops after each convolution, timed by the audits, do not count)
    fake_timer(monkeypatch, lambda name: 2e5 if name in ("contiguous", "all contiguous") else 1e5)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", auditor.NoisyPlanWarning)
        p = auditor.plan_layout(Twins().eval(), torch.randn(2, 3, 10, 10), repeats=7, max_repeats=35)
    c = _frame(p)
    for name in ("a", "b"):
        assert not c.at[name, "within_noise"] and c.at[name, "repeats"] == 7
        assert c.at[name, "ratio"] == pytest.approx(0.5, rel=1e-3) and c.at[name, "format"] == "channels_last"
        said = re.match(r"channels_last ([\d.]+)x faster \[([\d.]+), ([\d.]+)\]", c.at[name, "reason"])
        assert said and float(said[1]) == pytest.approx(2.0, rel=1e-3) and float(said[2]) > 1  # interval past 1
    cand = p.candidates.set_index("candidate")
    assert cand.at["all channels_last", "repeats"] == 7 and cand.at["all channels_last", "ratio"] == pytest.approx(0.5)
    assert not p.within_noise and p.chosen in ("all channels_last", "planned")
    assert p.formats["a"] == p.formats["b"] == "channels_last"


def test_keyword_arguments_reach_the_model(fast):
    torch.manual_seed(0)
    model = Shifted().eval()
    x, shift = torch.randn(2, 3, 8, 8), torch.randn(1, 8, 8, 8)
    ref = model(x, shift=shift, scale=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", auditor.NoisyPlanWarning)
        p = auditor.plan_layout(model, x, kwargs={"shift": shift, "scale": 2.0}, repeats=2, max_repeats=5,
                             recordings=1)
    assert set(p.formats) == {"stem", "head"} and p.kwargs["scale"] == 2.0
    torch.testing.assert_close(p.reference, ref)
    applied = auditor.apply_plan(model, p)
    assert applied.allclose
    torch.testing.assert_close(model(x, shift=shift, scale=2.0), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        auditor.plan_layout(model, x, kwargs=[("shift", shift)])
    with pytest.raises(TypeError, match="keys must be strings"):
        auditor.plan_layout(model, x, kwargs={0: shift})
    with pytest.raises(ValueError, match="max_repeats"):
        auditor.plan_layout(model, x, kwargs={"shift": shift}, repeats=5, max_repeats=3)


def test_progress_bar_is_shown_and_switched_off(fast, monkeypatch, capsys):
    fake_timer(monkeypatch, lambda name: 2e5 if name in ("contiguous", "all contiguous") else 1e5)
    model, x = Twins().eval(), torch.randn(1, 3, 6, 6)
    auditor.plan_layout(model, x, recordings=1, progress=True)
    assert "plan_layout" in capsys.readouterr().err
    auditor.plan_layout(model, x, recordings=1)  # ENABLED = False (the fixture)
    assert "plan_layout" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "ENABLED", None)
    monkeypatch.setenv("AUDITOR_PROGRESS", "0")
    auditor.plan_layout(model, x, recordings=1)
    assert "plan_layout" not in capsys.readouterr().err
    monkeypatch.setenv("AUDITOR_PROGRESS", "1")
    auditor.plan_layout(model, x, recordings=1)
    assert "plan_layout" in capsys.readouterr().err


def test_a_plan_reason_agrees_with_its_candidates_table():
    """Issue 29: a plan kept all contiguous (the default; nothing beat it beyond the noise) while
    its table measured it slowest, and its reason said "all contiguous measured fastest". The
    reason now follows the table: fastest only when it is, else what measured faster and why
    it was not taken."""
    import pandas as pd

    cand = pd.DataFrame({"candidate": ["planned", "all contiguous", "all channels_last"],
                         "measured_us": [20_100.0, 20_600.0, 19_600.0]})
    kept = layout.why_chosen(cand, "all contiguous", 0.05)
    assert "fastest" not in kept and "all channels_last measured 19.6 ms against its 20.6 ms" in kept
    assert layout.why_chosen(cand, "all channels_last", 0.05) == "all channels_last measured fastest end to end"
