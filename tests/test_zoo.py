"""A zoo of real third-party models (timm, segmentation_models_pytorch, diffusers, torchvision).

The planted models of tests/planted.py show each pattern alone; these show that the auditor
blames the library line a user would change in models people really train, and nothing else.
Every pinned cause was confirmed by rewriting its line in memory (tests/zoo_patches.py): the
cause and its hotspots vanish, and the model computes the same values. Causes are matched by
the text of their line, so a release that only shifts lines keeps passing.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
import torch
from aligned import hotspots_moving_in
from kernels import assert_causes_follow_the_kernels, convs_that_lose
from zoo_patches import FIXES, HYBRIDS, ZOO, ZooModel, cause_keys, patched

import auditor

pytestmark = pytest.mark.zoo

#: model -> (the auditor defect it shows, the tests that fail because of it). Each test is
#: expected to fail, strictly: it must be unmarked once the defect is fixed.
DEFECTS: dict[str, tuple[str, set[str]]] = {}


def _defect(request, name: str, test: str) -> None:
    reason, tests = DEFECTS.get(name, ("", ()))
    if test in tests:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def _audit(z: ZooModel, model, inputs) -> auditor.Audit:
    """One training step, recorded with source lines; gradients reset so every audit sees the
    same first step."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with z.threads_set():
        return auditor.audit(model, *inputs, record_source=True)


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    items = out.values() if isinstance(out, Mapping) else out
    return [t for t in items if isinstance(t, torch.Tensor)]


def _values(z: ZooModel, model, inputs) -> list[torch.Tensor]:
    """Outputs and the input's gradient of one training step. The loss weighs the outputs at
    random (the same weights every time): their plain sum can be a constant, whose gradient is
    zero (a head that batch-normalises its features before the classifier)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    x = inputs[0].detach().requires_grad_()
    with z.threads_set():
        outs = _tensors(model(x, *inputs[1:]))
        weights = torch.Generator().manual_seed(1)
        sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum() for o in outs).backward()
    return [o.detach() for o in outs] + [x.grad]


def _keys(frame, *columns: str) -> set[tuple]:
    return set(zip(*(frame[c] for c in columns)))


def _groups(a: auditor.Audit) -> set[tuple]:
    """Hotspot groups, as ``Audit.hotspots()`` groups them."""
    return _keys(a.hotspots(), "phase", "module", "op", "source", "kind")


@dataclass
class Built:
    z: ZooModel
    model: torch.nn.Module
    inputs: tuple
    audit: auditor.Audit
    #: a float64 copy: patched and unpatched values are compared where rounding cannot hide a change
    model64: torch.nn.Module
    inputs64: tuple
    #: audits and values already made, per list of fixes (causes that share a fix share them)
    _made: dict = field(default_factory=dict, repr=False)

    def audit_with(self, fixes) -> auditor.Audit:
        key = ("audit", *fixes)
        if key not in self._made:
            with patched(fixes, self.model):
                self._made[key] = _audit(self.z, self.model, self.inputs)
        return self._made[key]

    def values_with(self, fixes) -> list[torch.Tensor]:
        key = ("values", *fixes)
        if key not in self._made:
            with patched(fixes, self.model64):
                self._made[key] = _values(self.z, self.model64, self.inputs64)
        return self._made[key]


@pytest.fixture(scope="module", params=[pytest.param(z, id=z.name, marks=[pytest.mark.slow] if z.slow else [])
                                        for z in ZOO + HYBRIDS])
def zoo(request) -> Built:
    z: ZooModel = request.param
    pytest.importorskip(z.library)
    model, inputs = z.make()
    if any(c.pattern == "conv_no_kernel" for c in z.causes):
        with z.threads_set():
            if not convs_that_lose(model, inputs):
                pytest.skip(f"{z.name}: every convolution of it has a channels_last kernel on this machine, "
                            "so the causes pinned for it do not happen")
    inputs64 = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    return Built(z, model, inputs, _audit(z, model, inputs), copy.deepcopy(model).double(), inputs64)


def test_every_confirmed_cause_is_reported(zoo, request):
    _defect(request, zoo.z.name, "reported")
    assert {c.key for c in zoo.z.causes} <= cause_keys(zoo.audit.causes())


def test_no_other_cause_is_reported(zoo, request):
    _defect(request, zoo.z.name, "only")
    assert cause_keys(zoo.audit.causes()) <= {c.key for c in zoo.z.causes}


def test_every_hotspot_has_exactly_one_cause(zoo, request):
    _defect(request, zoo.z.name, "invariants")
    a = zoo.audit
    causes, hot, ops = a.causes(), a.hotspots(), a.ops()
    assert (hot["cause"] > 0).all()
    assert causes["hotspots"].sum() == ops["hotspot"].sum()
    outputs = a.tensors[a.tensors["role"] == "output"]
    for c in causes.itertuples():
        seqs = ops.index[(ops["phase"] == c.phase) & (ops["op"] == c.op) & (ops["source"] == c.source)]
        assert not outputs[outputs["seq"].isin(seqs)]["is_view"].all(), f"a view is a cause: {c.op} at {c.source}"
    fixes = auditor.suggest_fixes(a).frame
    assert fixes["cause"].is_unique
    assert set(fixes["cause"]) <= set(causes["cause"])
    # a fix that moves more bytes than it saves is never made automatically; it says why
    assert (fixes.loc[fixes["automatic"], "bytes"] > 0).all()
    assert (fixes.loc[~fixes["automatic"], "reason"].str.len() > 0).all()


def test_fixing_each_cause_line_removes_it_and_keeps_the_values(zoo):
    """Each fix, applied after the fixes that hide its effect: its cause vanishes with its
    hotspots, no hotspot or cause appears, and outputs and input gradients stay the same."""
    for cause in zoo.z.causes:
        before_fixes = [FIXES[n] for n in cause.after]
        before = zoo.audit_with(before_fixes) if before_fixes else zoo.audit
        after = zoo.audit_with(before_fixes + [FIXES[cause.fix]])
        what = f"{cause.fix} for {cause.key}"
        assert cause.key not in cause_keys(after.causes()), what
        assert cause_keys(after.causes()) <= cause_keys(before.causes()), what
        assert _groups(after) < _groups(before), what
        for new, old in zip(zoo.values_with(before_fixes + [FIXES[cause.fix]]), zoo.values_with(before_fixes)):
            change = float((new - old).abs().max() / old.abs().max())
            assert change <= 1e-7, f"{what} changed the values by {change:.1e} of their scale"


def test_fixing_every_cause_leaves_no_hotspot(zoo):
    left = _groups(zoo.audit_with(zoo.z.fixes))
    assert not left, f"hotspots no pinned cause explains: {sorted(left)}"


def test_no_layout_independent_copy_is_a_hotspot(zoo):
    """No hotspot op of the channels_last audit moves data the same way (the same kind: loses,
    converts, restores) at the same event of the all-contiguous audit of the same model: a conversion made whatever the
    layout is no format problem, whether or not a fix would save it. Events are lined up by
    (phase, module, op, source, occurrence), not by line: one line can convert in both layouts
    in one block and in channels_last only in another."""
    model, inputs = zoo.z.make(torch.contiguous_format)
    both = hotspots_moving_in(zoo.audit, _audit(zoo.z, model, inputs))
    assert not both, f"{len(both)} conversions made in any layout, reported as hotspots: {both[:5]}"


def test_the_zoo_covers_every_pattern_it_was_built_for():
    patterns = {c.pattern for z in ZOO for c in z.causes}
    assert {"mean_backward", "channel_slice", "inplace_view", "stack_reduce", "explicit_copy",
            "weight_rebuilt", "nc11_broadcast", "channel_shuffle", "conv_no_kernel"} <= patterns
    assert sum(not z.causes for z in ZOO) >= 2  # negative controls
    assert len({z.name for z in ZOO + HYBRIDS}) == len(ZOO + HYBRIDS)


#: Forward-only execution modes, against the forward causes of the training step.
MODES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_same_forward_causes_in_every_execution_mode(zoo, mode):
    """The forward causes of the training step are those of a forward pass under no_grad,
    inference_mode (composite ops reach the recorder undecomposed) and bf16 autocast, wherever
    this machine runs the same convolution kernels in that mode (a bfloat16 (k, 1, 1) Conv3d
    can run oneDNN's channels_last_3d kernel where float32 runs slow_conv3d, which writes
    contiguous); where it does not, the causes follow the kernels it ran."""
    forward = zoo.audit.causes()
    step = cause_keys(forward[forward["phase"] == "forward"])
    zoo.model.zero_grad(set_to_none=True)
    with zoo.z.threads_set():
        here, there = (convs_that_lose(zoo.model, zoo.inputs, m) for m in (contextlib.nullcontext, MODES[mode]))
        torch.manual_seed(0)
        with MODES[mode]():
            seen = auditor.audit(zoo.model, *zoo.inputs, backward=False, record_source=True)
    if here != there:
        assert_causes_follow_the_kernels(seen, there, zoo.audit, cause_keys)
        return
    assert cause_keys(seen.causes()) == step
