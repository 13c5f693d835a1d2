"""The entry point checks before it acts, and what it returns is finished.

``auditor.audit`` refuses a wrong argument, or one that does not apply with the others, before any
step runs: a refused call leaves the model as it was, batch-norm statistics included. The
``Audit`` it returns is complete when it is made, and nothing writes into it afterwards.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import auditor
from auditor import _session

CL = torch.channels_last


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).softmax(dim=1))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _refused_calls(model, x):
    """(call, error, words): each a combination ``audit()`` must refuse before any step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return [
        (lambda: auditor.audit(model, x, device="meta"), ValueError, "fake=True"),
        (lambda: auditor.audit(model, x, dtype=torch.float16), ValueError, "fake=True"),
        (lambda: auditor.audit(model, x, device="cpu", warmup=3), ValueError, "fake=True"),
        (lambda: auditor.audit(model, x, compile=True, device="cpu"), ValueError, "compiled audit"),
        (lambda: auditor.audit(model, x, compile=True, dtype=torch.float64), ValueError, "compiled audit"),
        (lambda: auditor.audit(model, x, compile=True, fake=True), ValueError, "fake audit runs no compiled"),
        (lambda: auditor.audit(model, x, compile_options={"fullgraph": True}), ValueError, "compile=True"),
        (lambda: auditor.audit(model, x, fake=True, record_time=True), ValueError, "no times"),
        (lambda: auditor.audit(model, x, fake=True, warmup=2), ValueError, "nothing to warm up"),
        (lambda: auditor.audit(model, x, fake=True, dtype=torch.int32), ValueError, "floating"),
        (lambda: auditor.audit(model, x, fake=True, device="gpu"), ValueError, "not a device"),
        (lambda: auditor.audit(model, x, warmup=-1), ValueError, "at least 0"),
        (lambda: auditor.audit(model, x, warmup=True), ValueError, "number of steps"),
        (lambda: auditor.audit(model, x, backward=False, loss_fn=lambda y: y.sum()), ValueError, "loss_fn"),
        (lambda: auditor.audit(model, x, backward=False, optimizer=opt, warmup=1), ValueError, "optimizer"),
        (lambda: auditor.audit(model, x, kwargs=[("mask", None)]), TypeError, "mapping"),
        (lambda: auditor.audit("not a model", x), TypeError, "callable"),
    ]


def test_a_refused_call_runs_no_step_and_leaves_the_batch_norm_statistics_alone():
    torch.manual_seed(0)
    model = ConvBN().to(memory_format=CL).train()
    x = torch.randn(2, 3, 8, 8).to(memory_format=CL)
    before = _state(model)
    calls = _refused_calls(model, x)
    for call, error, words in calls:
        with pytest.raises(error, match=words):
            call()
        after = _state(model)
        for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "conv.weight"):
            assert torch.equal(after[name], before[name]), (words, name)
    assert all(p.grad is None for p in model.parameters())
    # the same model, audited as asked, does move them: the check above can see a step
    auditor.audit(model, x, record_time=True, warmup=1)
    # a profiled warm-up, the plain steps timed around one under the profiler alone, the recorded step
    steps = 1 + _session.PLAIN_STEPS + 1 + 1
    assert int(model.bn.num_batches_tracked) == steps and not torch.equal(model.bn.running_mean, before["bn.running_mean"])


def test_an_audit_is_a_finished_value():
    """Built with all it knows (the warm-up, the compiled step); nothing can be written into it
    afterwards, and verifying its fixes leaves it as it was."""
    torch.manual_seed(0)
    model, x = ConvBN().to(memory_format=CL), torch.randn(2, 3, 8, 8).to(memory_format=CL)
    a = auditor.audit(model, x, warmup=0)
    assert a.warmup == 0 and a.compiled is None
    for name in ("events", "tensors", "hidden", "complete", "error", "warmup", "compiled"):
        with pytest.raises(AttributeError):
            setattr(a, name, None)
    with pytest.raises(AttributeError):
        a.verification = None  # no layer above can hang its results on it
    # the estimate's trust after no warm-up is the analysis' verdict, the same wherever it is read
    assert a.causes().equals(a.analysis().causes) and not a.causes()["saving_trusted"].any()
    with auditor.FormatAuditor() as fa:
        model(x)
    assert fa.audit.warmup is None and fa.audit.compiled is None
