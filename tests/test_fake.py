"""Fake audits: the ops and strides of a real run, for a device the machine need not have.

Fidelity is measured against real CPU audits of the tutorial's CPU models; the few events whose
strides differ are pinned with their cause in ``KNOWN_MISMATCHES``, so a new one fails.
"""

from __future__ import annotations

import ast
import collections
import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torchvision
from pandas.testing import assert_frame_equal
from planted import MODELS as PLANTED
from planted import make
from torch._subclasses.fake_tensor import FakeTensor

import auditor
import auditor._fake as fake_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from zoo import EXTRA_KWARGS, ICE_LAKE_MODELS, input_size  # noqa: E402

from tests.kernels import fake_cuda_problem, needs_fake_cuda  # noqa: E402

CL = torch.channels_last
#: the device a fake audit targets where any device will do: cuda, unless this torch cannot fake it here
FAKE_TARGET = "cuda" if fake_cuda_problem() is None else "cpu"
SIZE1 = "size-1 strides"

#: op -> why its output strides differ between a fake and a real CPU run. Every one of them
#: differs only in dimensions of size 1, which address no memory (the format is the same).
KNOWN_MISMATCHES = {
    "aten.view.default": (
        "the fake view is torch._refs._reshape_view_helper (Python), which gives a size-1 "
        "dimension another stride than eager's at::detail::computeStride (shufflenet's "
        "channel_shuffle views a 1xCxHxW map)"
    ),
    "aten.transpose.int": "carries the size-1 stride of the view it transposes (shufflenet)",
    "aten.mul.Tensor": (
        "an elementwise op on an ambiguous tensor (NC11 here: inception's dropout mask on a "
        "1x2048x1x1 map): eager's TensorIterator sees every operand contiguous and allocates a "
        "plain contiguous result, the meta rule (torch._refs.mul, the fake fast path) permutes "
        "the input's strides; they differ on the size-1 dimensions only"
    ),
    "aten.sigmoid.default": "the same, on an N1HW gate (the C++ meta kernel keeps the input's strides)",
    "aten.squeeze.dim": "carries the size-1 strides of the mul's gradient it squeezes (inception)",
    "aten.detach.default": "carries the size-1 strides of the sigmoid it detaches (the gate)",
}

#: Zoo models compared in the default run; the rest of the tutorial's list is marked slow.
FAST_MODELS = ("resnet18", "shufflenet_v2_x0_5", "googlenet")


# -- comparing two audits ----------------------------------------------------------------------


@dataclass
class Fidelity:
    events: int = 0
    exact: int = 0  # same op, same output shapes and strides
    layout: int = 0  # same op and shapes, strides equal on every dimension of size > 1
    mismatches: collections.Counter = field(default_factory=collections.Counter)  # (op, why)


def repeated_detaches(a: auditor.Audit) -> set[int]:
    """The detaches of the tensor the event just before detached: a second detach that moves
    nothing, which some releases' autograd bookkeeping makes (torch 2.8: fake tensors at every
    detach, real ones at a leaf's first gradient) and others do not."""
    ops = a.events["op"].astype(str).to_numpy()
    t = a.tensors
    outs = dict(zip(t.loc[t["role"] == "output", "seq"], t.loc[t["role"] == "output", "tid"]))
    ins = dict(zip(t.loc[t["role"] == "input", "seq"], t.loc[t["role"] == "input", "tid"]))
    return {i for i in range(1, len(ops)) if ops[i] == ops[i - 1] == "aten.detach.default"
            and i in ins and ins[i] == outs.get(i - 1)}


def same_events(fake: auditor.Audit, real: auditor.Audit) -> None:
    """The fake audit's events are the real one's: identical frames where this torch makes no
    repeated detach in either, else the same ops in order once those are left out."""
    repeated = repeated_detaches(fake) | repeated_detaches(real)
    if not repeated:
        assert_frame_equal(fake.events, real.events)
        return
    keep = [[op for i, op in enumerate(a.events["op"].astype(str)) if i not in repeated_detaches(a)]
            for a in (fake, real)]
    assert keep[0] == keep[1]


def same_hotspots(fake: auditor.Audit, real: auditor.Audit) -> bool:
    """The same hotspot groups; where either audit has repeated detaches, the events' numbers
    (``first_seq``) differ by them and are left out."""
    a, b = fake.hotspots(), real.hotspots()
    if repeated_detaches(fake) | repeated_detaches(real):
        a, b = a.drop(columns=["first_seq"]), b.drop(columns=["first_seq"])
    return a.equals(b)


def _outputs(a: auditor.Audit) -> tuple[list[str], list[tuple]]:
    """Per event but the repeated detaches: its op, and the (shape, strides) strings of its results."""
    out = a.tensors[a.tensors["role"] == "output"]
    results: dict[int, list] = collections.defaultdict(list)
    for seq, shape, strides in zip(out["seq"].to_numpy(), out["shape"].astype(str), out["strides"].astype(str)):
        results[int(seq)].append((shape, strides))
    ops = a.events["op"].astype(str).tolist()
    kept = [i for i in range(len(ops)) if i not in repeated_detaches(a)]
    return [ops[i] for i in kept], [tuple(results.get(i, ())) for i in kept]


def _size1_only(real: tuple, fake: tuple) -> bool:
    for (shape, s_real), (_, s_fake) in zip(real, fake):
        dims = zip(ast.literal_eval(shape), ast.literal_eval(s_real), ast.literal_eval(s_fake))
        if any(n != 1 and a != b for n, a, b in dims):
            return False
    return True


def compare(real: auditor.Audit, fake: auditor.Audit) -> Fidelity:
    """Align the two op sequences and compare every aligned event's results."""
    r_ops, r_out = _outputs(real)
    f_ops, f_out = _outputs(fake)
    fid = Fidelity(events=max(len(r_ops), len(f_ops)))
    matcher = difflib.SequenceMatcher(a=r_ops, b=f_ops, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            fid.mismatches.update((op, "real only") for op in r_ops[i1:i2])
            fid.mismatches.update((op, "fake only") for op in f_ops[j1:j2])
            continue
        for i, j in zip(range(i1, i2), range(j1, j2)):
            if r_out[i] == f_out[j]:
                fid.exact += 1
                fid.layout += 1
            elif [s for s, _ in r_out[i]] != [s for s, _ in f_out[j]]:
                fid.mismatches[(r_ops[i], "shapes")] += 1
            elif _size1_only(r_out[i], f_out[j]):
                fid.layout += 1
                fid.mismatches[(r_ops[i], SIZE1)] += 1
            else:
                fid.mismatches[(r_ops[i], "strides")] += 1
    return fid


def zoo_model(name: str):
    """A zoo model in channels_last and a 1x3xSxS input. Built on the meta device and zeroed:
    strides do not depend on values, and random init of the VGGs costs seconds."""
    with torch.device("meta"):
        model = getattr(torchvision.models, name)(weights=None, **EXTRA_KWARGS.get(name, {}))
    model = model.to_empty(device="cpu").to(memory_format=CL)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.zero_()
    torch.manual_seed(0)
    side = input_size(name, 64)
    return model, torch.randn(1, 3, side, side).to(memory_format=CL)


@pytest.fixture(scope="module")
def fidelity():
    """name -> (Fidelity, hotspots equal): each zoo model compared once per session."""
    cache: dict[str, tuple[Fidelity, bool]] = {}

    def get(name: str) -> tuple[Fidelity, bool]:
        if name not in cache:
            model, x = zoo_model(name)
            fake = auditor.audit(model, x, fake=True, record_source=False)  # first: the real step leaves gradients
            real = auditor.audit(model, x, record_source=False, record_time=False)
            cache[name] = (compare(real, fake), same_hotspots(fake, real))
        return cache[name]

    return get


def _describe(fid: Fidelity) -> str:
    lines = [f"{fid.exact}/{fid.events} events exact ({fid.exact / max(fid.events, 1):.2%})"]
    for (op, why), n in fid.mismatches.most_common():
        cause = KNOWN_MISMATCHES.get(op, "NEW: not in KNOWN_MISMATCHES")
        lines.append(f"  {op} [{why}] x{n}: {cause}")
    return "\n".join(lines)


# -- fidelity ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in FAST_MODELS else pytest.mark.slow) for n in ICE_LAKE_MODELS],
)
def test_fake_cpu_audit_matches_real_cpu_audit(name, fidelity):
    """Same op sequence; results differ only where pinned, and only in size-1 dimensions."""
    fid, same_hotspots = fidelity(name)
    report = _describe(fid)
    new = [(op, why) for op, why in fid.mismatches if op not in KNOWN_MISMATCHES or why != SIZE1]
    assert not new, f"{name}: new mismatches {new}\n{report}"
    assert fid.layout == fid.events, report
    assert same_hotspots, f"{name}: hotspots differ between the fake and the real audit"


def test_fidelity_of_the_fast_models(fidelity):
    """The default run's share: at least 99% of events agree exactly, pinned ones included."""
    total = Fidelity()
    for name in FAST_MODELS:
        fid, _ = fidelity(name)
        total.events += fid.events
        total.exact += fid.exact
    assert total.exact >= 0.99 * total.events, f"{total.exact}/{total.events}"


@pytest.mark.slow
def test_fidelity_over_the_zoo(fidelity, capsys):
    """Every model of the tutorial's CPU list: at least 99% of all events agree exactly."""
    total = Fidelity()
    lines = []
    for name in ICE_LAKE_MODELS:
        fid, _ = fidelity(name)
        total.events += fid.events
        total.exact += fid.exact
        total.mismatches.update(fid.mismatches)
        lines.append(f"{name:20} {fid.events:5} events  exact {fid.exact / fid.events:7.2%}  "
                     f"layout {fid.layout / fid.events:7.2%}  {dict(fid.mismatches) or ''}")
    with capsys.disabled():
        print("\nfake vs real CPU audits (forward + backward, batch 1):\n" + "\n".join(lines))
        print(f"all: {total.exact}/{total.events} exact ({total.exact / total.events:.2%})")
    assert total.exact >= 0.99 * total.events, _describe(total)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_models_fake_equals_real(name):
    """The planted breaks: identical events and hotspots; tensors differ only where pinned."""
    model, x = make(name)
    fake = auditor.audit(model, x, fake=True, record_source=False)
    real = auditor.audit(model, x, record_source=False, record_time=False)
    same_events(fake, real)
    assert same_hotspots(fake, real), (fake.hotspots(), real.hotspots())
    fid = compare(real, fake)
    assert all(op in KNOWN_MISMATCHES and why == SIZE1 for op, why in fid.mismatches), _describe(fid)
    assert fid.layout == fid.events


# -- the zoo: every kernel's strides, fake against real -------------------------------------------

from op_corpus import kernel_disagreement  # noqa: E402
from zoo_patches import HYBRIDS, ZOO  # noqa: E402


@pytest.mark.zoo
@pytest.mark.parametrize("z", [pytest.param(z, id=z.name, marks=pytest.mark.slow if z.slow else ())
                               for z in ZOO + HYBRIDS])
def test_fake_cpu_audit_of_every_zoo_model_writes_what_the_real_kernels_write(z):
    """Every zoo model, one training step at its zoo input: every result a kernel chose the
    strides of (ops that write new tensors, 3 or more dimensions) has the same strides in the
    fake audit as in the real one, forward and backward, and the two find the same causes and
    the same hotspots among those ops. (Autograd replays an in-place write into a view
    differently for fake tensors, so the real step's ``copy_`` of that replay has no fake twin:
    in-place and view ops are compared through the causes.) A new op whose meta kernel
    disagrees with this machine's kernel fails here unless the probe asks it."""
    with z.threads_set():
        model, inputs = z.make()
        real = auditor.audit(model, *inputs, record_time=False, record_source=False)
        model, inputs = z.make()
        fake = auditor.audit(model, *inputs, fake=True, device="cpu", record_source=False)
    assert kernel_disagreement(real, fake) == []
    assert fake.kernels is not None and set(fake.kernels["checked"]) <= {"kernel"}, fake.kernels
    causes = [sorted(map(tuple, a.causes()[["pattern", "phase", "op", "module"]].astype(str).values))
              for a in (real, fake)]
    if causes[0] != causes[1]:
        ran = [collections.Counter(a.events.loc[a.events["phase"] == "backward", "op"].astype(str)) for a in (real, fake)]
        if ran[0] != ran[1]:  # not the kernels' layouts: the step autograd ran for fake tensors
            differ = sorted(op for op in set(ran[0]) | set(ran[1]) if ran[0][op] != ran[1][op])
            pytest.skip(f"autograd ran other backward ops for fake tensors than for real ones on torch "
                        f"{torch.__version__} ({', '.join(f'{op} {ran[0][op]} vs {ran[1][op]}' for op in differ)}), "
                        "and the causes differ with them: a fake audit of this model is not exact on this release")
    assert causes[0] == causes[1]
    hot = [_kernel_rows(a.hotspots()[["phase", "module", "op", "kind", "bytes"]]) for a in (real, fake)]
    assert hot[0].equals(hot[1]), hot


def _kernel_rows(frame: pd.DataFrame) -> pd.DataFrame:
    from auditor._recording._probe import returns_fresh

    fresh = [returns_fresh(_overload(op)) for op in frame["op"].astype(str)]
    return frame[fresh].reset_index(drop=True)


def _overload(name: str):
    packet, _, overload = name.rpartition(".")
    ns, _, op = packet.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def test_fake_parameters_are_logged_as_parameters():
    model, x = make("clean")
    fake = auditor.audit(model, x, fake=True, record_source=False)
    real = auditor.audit(model, x, record_source=False, record_time=False)
    assert fake.tensors["is_param"].sum() == real.tensors["is_param"].sum() > 0


# -- the user's objects are left alone -----------------------------------------------------------


def _snapshot(model: nn.Module) -> dict:
    return {
        name: (t.data_ptr(), t.device, t.dtype, t.stride(), t.requires_grad, t.grad is None,
               t.detach().clone())
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    }


def _assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for name, (*meta, values) in before.items():
        *meta_after, values_after = after[name]
        assert meta == meta_after, name
        assert torch.equal(values, values_after), name


def _no_fakes(model: nn.Module) -> None:
    for module in model.modules():
        for value in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
            assert not isinstance(value, FakeTensor), type(module).__name__


@pytest.mark.parametrize("device, dtype", [("cpu", None), pytest.param("cuda", torch.float16, marks=needs_fake_cuda),
                                           ("cpu", torch.bfloat16)])
def test_model_and_optimizer_are_not_modified(device, dtype):
    model, x = zoo_model("resnet18")
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = _snapshot(model)
    a = auditor.audit(model, x, fake=True, device=device, dtype=dtype, optimizer=optimizer)
    assert (a.events["phase"] == "other").any()
    _assert_same(before, _snapshot(model))
    _no_fakes(model)
    assert model.training
    assert not optimizer.state
    assert all(not isinstance(p, FakeTensor) for g in optimizer.param_groups for p in g["params"])


def test_optimizer_step_matches_real():
    """The optimizer phase too: SGD with momentum, the same ops as a real step on CPU."""
    model, x = make("clean")
    fake = auditor.audit(model, x, fake=True, record_source=False,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    real = auditor.audit(model, x, record_source=False, record_time=False,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert (real.events["phase"] == "other").sum() > 0
    same_events(fake, real)


@needs_fake_cuda
def test_fake_cuda_optimizer_takes_the_foreach_path():
    """torch picks foreach kernels for real cuda parameters; the fake step does the same."""
    model, x = make("clean")
    a = auditor.audit(model, x, fake=True, device="cuda", optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    other = a.events.loc[a.events["phase"] == "other", "op"].astype(str)
    assert other.str.startswith("aten._foreach_").any(), other.tolist()


# -- target device and dtype -----------------------------------------------------------------------


def test_dtype_override_shows_in_the_log():
    model, x = zoo_model("resnet18")
    a = auditor.audit(model, x, fake=True, dtype=torch.bfloat16)
    ts = a.tensors.merge(a.events[["seq", "op"]], on="seq")
    conv = ts[ts["op"].astype(str) == "aten.convolution.default"]
    assert set(conv["dtype"].astype(str)) == {"bfloat16"}
    assert set(ts.loc[ts["arg"] == "weight", "dtype"].astype(str)) == {"bfloat16"}
    assert next(model.parameters()).dtype == torch.float32


@needs_fake_cuda
def test_fake_cuda_forward_runs_here_with_cuda_kernels():
    """On a CPU-only machine: the log says cuda:0 and shows cuda's kernel choices."""
    model, x = zoo_model("resnet18")
    a = auditor.audit(model, x, fake=True, device="cuda", backward=False)
    assert set(a.tensors["device"].astype(str)) == {"cuda:0"}
    ops = set(a.events["op"].astype(str))
    assert "aten.cudnn_batch_norm.default" in ops and "aten.native_batch_norm.default" not in ops
    assert a.hotspots().empty


@needs_fake_cuda
@pytest.mark.parametrize(
    "dtype, batch_norm",
    [(None, "aten.cudnn_batch_norm_backward.default"),
     # cuDNN takes half inputs only with float weights: an all-half model gets the native kernel
     (torch.float16, "aten.native_batch_norm_backward.default")],
)
def test_fake_cuda_backward_runs_here(dtype, batch_norm):
    """The engine never sees a cuda node (see auditor._fake._DeviceShim); the log never sees meta."""
    model, x = zoo_model("resnet18")
    a = auditor.audit(model, x, fake=True, device="cuda", dtype=dtype)
    assert a.complete
    bw = a.events[a.events["phase"] == "backward"]
    assert {batch_norm, "aten.convolution_backward.default"} <= set(bw["op"].astype(str))
    assert set(a.tensors["device"].astype(str)) == {"cuda:0"}
    # every analysis works on the result
    assert a.hotspots().empty
    assert len(a.summary()) and len(a.coverage()) and "aten ops" in a.report()
    back = auditor.Audit.read_csv(a.to_csv())
    assert_frame_equal(back.events, a.events)
    assert_frame_equal(back.tensors, a.tensors)


@needs_fake_cuda
def test_hiding_the_device_from_autograd_changes_no_op(monkeypatch):
    """The meta answers given to autograd's bookkeeping change nothing that is recorded: forced
    on for a CPU target, the whole step is the same; off for a cuda forward, the same again."""
    model, x = zoo_model("shufflenet_v2_x0_5")
    plain = auditor.audit(model, x, fake=True, record_source=False)
    monkeypatch.setattr(fake_module, "_ACCELERATORS", ("cuda", "cpu"))
    hidden = auditor.audit(model, x, fake=True, record_source=False)
    assert_frame_equal(plain.events, hidden.events)
    assert_frame_equal(plain.tensors, hidden.tensors)
    monkeypatch.setattr(fake_module, "_ACCELERATORS", ())
    shown = auditor.audit(model, x, fake=True, device="cuda", backward=False, record_source=False)
    monkeypatch.setattr(fake_module, "_ACCELERATORS", ("cuda",))
    hidden = auditor.audit(model, x, fake=True, device="cuda", backward=False, record_source=False)
    assert_frame_equal(shown.events, hidden.events)
    assert_frame_equal(shown.tensors, hidden.tensors)


def test_meta_inputs_never_allocate_the_batch():
    model, _ = zoo_model("resnet18")
    x = torch.empty(4096, 3, 64, 64, device="meta").to(memory_format=CL)
    a = auditor.audit(model, x, fake=True)
    first = a.tensors.iloc[0]
    assert first["shape"] == "(4096, 3, 64, 64)" and first["device"] == "cpu"
    assert first["format"] == "channels_last"


def test_meta_model_needs_a_device():
    with torch.device("meta"):
        model = nn.Conv2d(3, 8, 3)
    x = torch.empty(1, 3, 8, 8, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        auditor.audit(model, x, fake=True)
    target = FAKE_TARGET
    a = auditor.audit(model, x, fake=True, device=target)
    assert set(a.tensors["device"].astype(str)) == {str(torch.device(target, 0) if target == "cuda" else target)}


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "meta", "mps", 3.5])
def test_bad_devices_are_refused(device):
    model, x = make("clean")
    with pytest.raises(ValueError, match="fake audit"):
        auditor.audit(model, x, fake=True, device=device)


def test_bad_dtype_and_options_without_fake_are_refused():
    model, x = make("clean")
    with pytest.raises(ValueError, match="floating"):
        auditor.audit(model, x, fake=True, dtype=torch.int32)
    with pytest.raises(ValueError, match="fake=True"):
        auditor.audit(model, x, device="cpu")


# -- the other options ---------------------------------------------------------------------------


def test_strict_and_record_source_work_on_fakes():
    model, x = make("softmax")
    with pytest.raises(auditor.FormatLossError, match="_softmax"):
        auditor.audit(model, x, fake=True, strict=True)
    a = auditor.audit(model, x, fake=True, record_source=True)
    fw = a.events[a.events["phase"] == "forward"]
    assert fw["source"].astype(str).str.contains("planted.py").any()


def test_plain_function_with_fake_inputs():
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL).requires_grad_()
    a = auditor.audit(lambda t: torch.relu(t) * 2, x, fake=True, device=FAKE_TARGET)
    assert set(a.tensors["device"].astype(str)) == {"cuda:0" if FAKE_TARGET == "cuda" else "cpu"}
    assert (a.events["phase"] == "backward").any()
    assert x.grad is None


def test_plain_function_capturing_a_real_module_is_refused():
    model, x = make("clean")
    with pytest.raises(TypeError, match="pass the nn.Module itself"):
        auditor.audit(lambda t: model(t), x, fake=True)
    assert all(p.grad is None for p in model.parameters())


def test_nothing_to_differentiate_is_refused_as_in_a_real_audit():
    model, x = make("clean")
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="requires grad on nothing"):
        auditor.audit(model, x, fake=True)
    a = auditor.audit(model, x, fake=True, backward=False)
    assert isinstance(a.events, pd.DataFrame) and len(a.events)


def test_fake_mode_sits_below_the_recorder_whatever_the_order():
    """FakeTensorMode is an infra mode, kept below every user mode: entered before or after the
    recorder, the recorder sees each op once, with fake tensors and the fake kernel's result.
    (Used bare like this, the log also holds the ``prim.device`` queries the fake audit hides.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, x = make("clean")
    audits = []
    for fake_first in (True, False):
        mode = FakeTensorMode(allow_non_fake_inputs=True)  # real parameters: fake constants
        fx = mode.from_tensor(x)
        fa = auditor.FormatAuditor()
        outer, inner = (mode, fa) if fake_first else (fa, mode)
        with outer, inner, torch.no_grad():
            model(fx)
        audits.append(fa.audit)
    first, second = audits
    assert_frame_equal(first.events, second.events)
    ops = first.events["op"].astype(str)
    assert (ops == "aten.convolution.default").sum() == 2
    assert set(first.tensors["device"].astype(str)) == {"cpu"}


def test_fake_audits_have_no_times():
    """Fake kernels compute nothing: no times are recorded, and asking for them is an error."""
    model, x = make("softmax")
    a = auditor.audit(model, x, fake=True)
    assert a.events["time_us"].isna().all() and a.events["duration_us"].isna().all() and a.hidden.empty
    with pytest.raises(ValueError, match="no times"):
        auditor.audit(model, x, fake=True, record_time=True)


def test_a_torch_whose_fake_cuda_tensors_reach_the_runtime_refuses_before_any_step(monkeypatch):
    """Where fake cuda tensors reach the CUDA runtime (torch 2.8 without a driver raises, or ends
    the process in autograd's bookkeeping), the fake audit refuses up front and names why."""
    monkeypatch.setattr(fake_module, "fake_device_problem", lambda device_type: "AcceleratorError: no driver")
    model, x = make("clean")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(auditor.TorchInternalsError, match=r"fake audits for cuda .*torch .*no driver"):
        auditor.audit(model, x, fake=True, device="cuda")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
