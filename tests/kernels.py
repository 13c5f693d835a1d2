"""What this machine's kernels do, asked instead of assumed.

Which kernel a convolution runs, and so which format it writes, depends on the CPU (AVX-512 or
AVX2 only, oneDNN's ISA), the dtype, the shape and the thread count. A test whose truth depends
on that asks here: it runs the convolutions of the very model, in the very mode, and reads the
formats they wrote. The audits under test read the same formats through the dispatch mode;
these probes read them through module hooks, independently of the recorder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from auditor import format_label

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def conv_formats(model: nn.Module, inputs: tuple, mode: Callable[[], contextlib.AbstractContextManager]
                 = contextlib.nullcontext) -> dict[str, tuple[str, str]]:
    """(input format, output format) of every convolution module's first call in one forward
    pass of ``model`` on ``inputs`` under ``mode()`` (run without gradients and restored to its
    training flag, so the model's weights and statistics are what they were)."""
    seen: dict[str, tuple[str, str]] = {}

    def hook(name):
        def record(_module, args, out):
            x, y = _first_tensor(args), _first_tensor(out)
            if name not in seen and x is not None and y is not None:
                seen[name] = (format_label(tuple(x.shape), x.stride()), format_label(tuple(y.shape), y.stride()))
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, _CONVS)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad(), mode():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(state)
    return seen


def convs_that_lose(model: nn.Module, inputs: tuple, mode=contextlib.nullcontext) -> set[str]:
    """The convolution modules that read a channels_last image and wrote another format, on
    this machine, under ``mode()``: those without a channels_last kernel for their shape,
    dtype and thread count here."""
    cl = ("channels_last", "channels_last_3d")
    # an ambiguous result (N x C x 1 x 1) is channels_last too: nothing was lost
    return {name for name, (a, b) in conv_formats(model, inputs, mode).items()
            if a in cl and b != a and not b.startswith("ambiguous")}


def assert_causes_follow_the_kernels(seen, losing: set[str], step, key: Callable) -> None:
    """For ``seen``, a forward audit of a mode whose convolution kernels differ here from the
    float32 step's: the convolutions it saw lose channels_last are exactly those the probe saw
    lose (``losing``), each of them on a convolution path is traced to a ``conv_no_kernel``
    cause, and its other causes are among the step's (``step``, an audit; causes compared by
    ``key``, a function of a causes frame). A convolution that now keeps (or loses) the format
    can hide a cause downstream of it, never make a new one of another pattern."""
    ops = seen.ops()
    convs = ops[(ops["phase"] == "forward") & ops["is_conv"]]
    lost = convs[convs["kind"] == "loses"]
    assert set(lost["module"].astype(str)) == losing, "the audit and this machine's kernels disagree"
    causes = seen.causes()
    conv_causes = set(causes.loc[causes["pattern"] == "conv_no_kernel", "cause"])
    assert set(lost.loc[lost["hotspot"], "cause"]) <= conv_causes
    before = step.causes()
    before = before[(before["phase"] == "forward") & (before["pattern"] != "conv_no_kernel")]
    assert key(causes[causes["pattern"] != "conv_no_kernel"]) <= key(before)


def support_here(fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], backward: bool = False) -> str:
    """``Audit.coverage()``'s ``support`` that one call of ``fn`` on a channels_last image of
    ``shape`` earns on this machine: ``full`` when its result (with ``backward``, the gradient
    it sends back for a channels_last gradient) is channels_last, else ``none``."""
    x = torch.randn(shape).to(memory_format=torch.channels_last).requires_grad_(backward)
    y = fn(x)
    if backward:  # as the backward op wrote it (x.grad would be re-laid out like x)
        (y,) = torch.autograd.grad(y, x, torch.randn_like(y).contiguous(memory_format=torch.channels_last))
    return "full" if y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous() else "none"


def fake_cuda_problem() -> str | None:
    """Why this torch's fake cuda tensors cannot stand in for a GPU here (None: they can)."""
    from auditor._recording._torch import fake_device_problem

    return fake_device_problem("cuda")


#: skips a test that audits on fake cuda tensors where this torch reaches the CUDA runtime for
#: them (the audit refuses there, which test_fake checks)
needs_fake_cuda = pytest.mark.skipif(fake_cuda_problem() is not None,
                                     reason=f"this torch's fake cuda tensors reach the CUDA runtime: {fake_cuda_problem()}")


def inductor_refusal() -> str | None:
    """Why compiled audits refuse this torch (None: they run)."""
    from auditor._recording._torch import TorchInternalsError, require_inductor

    try:
        require_inductor()
    except TorchInternalsError as exc:
        return str(exc)
    return None


#: skips a test of compiled audits where they refuse this torch (test_compiled checks the refusal)
needs_inductor = pytest.mark.skipif(inductor_refusal() is not None, reason=f"{inductor_refusal()}")
