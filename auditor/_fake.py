"""Fake audits: record one step on fake tensors, for a target device and dtype, without running it.

The layout a model ends up in depends on the target's kernels (cuDNN, CUDA, mkldnn), and a real
run costs the activations' memory and compute just to learn strides. ``FakeTensorMode`` runs the
meta and fake kernels instead: the same aten ops, the same output strides, no data, and for a
device the machine may not have.

How the pieces stack (``torch.utils._python_dispatch``): ``FakeTensorMode`` is an *infra* mode,
always kept below every user mode whatever the order of entry, so the recorder sees each aten op
exactly once, with fake inputs, and the fake kernel's result. Above the recorder sits
:class:`_DeviceShim`, which answers the C++ device queries of fake tensors (``prim.device``)
itself: the recorder would otherwise log them as ops, and on an accelerator it is where autograd's
bookkeeping is kept off the device (see the class).

The user's model is never touched: its parameters and buffers are swapped for fake ones only for
the call, by ``torch.func.functional_call``; real weights are never copied.
"""

from __future__ import annotations

import contextlib

import torch

from ._recording._kernels import restrider_for
from ._recording._torch import (
    FakeTensor,
    FakeTensorMode,
    TorchDispatchMode,
    TorchInternalsError,
    fake_device_problem,
    foreach_supported_devices,
    pytree,
    require,
)
from ._result import Audit
from ._session import FormatAuditor
from ._step import Step, default_loss, loss_to_backward

#: Device types a fake audit can target: those whose layout rules the tests cover.
DEVICE_TYPES = ("cpu", "cuda")
#: Device types with streams: autograd's bookkeeping for them is kept off the device.
_ACCELERATORS = ("cuda",)

_PRIM_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")


def resolve_device(device, tensors: list[torch.Tensor]) -> torch.device:
    """The target device: ``device`` if given, else the one device the model's tensors share."""
    if device is None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            raise ValueError(f"fake audit: the model's tensors are on several devices ({names}); pass device=")
        target = devices.pop() if devices else torch.device("cpu")
        if target.type == "meta":
            raise ValueError(
                "fake audit: the model is on the meta device, which has no layout rules of its own; "
                f"pass device= (one of {', '.join(DEVICE_TYPES)})"
            )
    else:
        try:
            target = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ValueError(f"fake audit: {device!r} is not a device ({exc})") from None
    if target.type not in DEVICE_TYPES:
        raise ValueError(
            f"fake audit: cannot target device {str(target)!r}; fake audits support "
            f"{', '.join(DEVICE_TYPES)}"
        )
    problem = fake_device_problem(target.type)
    if problem is not None:
        raise TorchInternalsError(
            f"fake audits for {target.type} need fake tensors that never reach the {target.type} runtime, but torch "
            f"{torch.__version__} reaches it on this machine, which has no {target.type} device ({problem}); "
            f"audit on a machine with the device, or use a newer torch")
    return target


def resolve_dtype(dtype) -> torch.dtype | None:
    """``None`` (keep each tensor's dtype) or a floating dtype for every floating tensor."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"fake audit: dtype must be a floating torch.dtype, got {dtype!r}")
    return dtype


class _Faker:
    """Real (or meta) tensors -> fake tensors on the target device and dtype, strides kept.

    A tensor seen twice (a tied weight, a parameter also passed as an input) maps to one fake.
    No data is read or copied: fakes are meta tensors underneath.
    """

    def __init__(self, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype | None):
        self.mode = mode
        self.device = device
        self.dtype = dtype
        self.memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(real) -> (real, fake)

    def __call__(self, t: torch.Tensor, param: bool = False) -> torch.Tensor:
        hit = self.memo.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
        if t.device == self.device and t.dtype == dtype:
            fake = self.mode.from_tensor(t)  # keeps strides, offset, aliasing and .grad
        else:
            with self.mode:
                fake = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=self.device)
            if param:
                fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
            elif t.requires_grad:
                fake.requires_grad_(True)
            if t.is_leaf and t.grad is not None:  # a step accumulates into held gradients
                fake.grad = self(t.grad)
        self.memo[id(t)] = (t, fake)
        return fake

    def like_param(self, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """Optimizer state: tensors shaped like their parameter follow it; others (``step``) stay."""
        if state.shape == param.shape:
            return self(state)
        return self.mode.from_tensor(state)


class _DeviceShim(TorchDispatchMode):
    """Answers ``prim.device`` for fake tensors, above the recorder, and passes every op on.

    C++ asks a fake tensor for its device through the dispatcher (``prim.device``); a mode sees
    those calls. Answered here they never reach the recorder as ops.

    On an accelerator the answer is also where autograd is kept off the device. Autograd notes
    each tensor's device when it records a node (``InputMetadata``); a node on an accelerator
    makes the engine stash and sync that device's streams, which needs a real device (on a
    machine without one: "hasPrimaryContext expects a valid device index"). So the queries that
    are autograd's bookkeeping are answered ``meta`` (as ``FakeTensor`` itself does inside a
    kernel): the first query of each floating result of an op that autograd records (the node's
    metadata, asked right after the op returns), every query while gradient accumulators are
    made, and every query during the backward call (the engine's checks; the backward kernels
    themselves see the real fake device). Every other query, such as a composite op choosing its
    kernel (``batch_norm`` picks ``cudnn_batch_norm`` on cuda), gets the true device.
    """

    def __init__(self, hide: bool):
        super().__init__()
        self.hide = hide  # keep autograd's bookkeeping off the device
        self.hide_all = False  # answer meta to every query (accumulators, the backward call)
        self._fresh: dict[int, torch.Tensor] = {}  # results whose next query is autograd's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        if func is _PRIM_DEVICE:
            t = args[0]
            if isinstance(t, FakeTensor):
                if self.hide and (self.hide_all or self._fresh.pop(id(t), None) is t):
                    return _META
                return t.fake_device
            return func(*args, **kwargs)
        if not self.hide:
            return func(*args, **kwargs)
        fresh = self._fresh
        if fresh:
            fresh.clear()
        out = func(*args, **kwargs)
        if not self.hide_all and torch.is_grad_enabled() and _any_requires_grad(args, kwargs):
            for o in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()):
                    fresh[id(o)] = o
        return out


def _any_requires_grad(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif type(a) in (list, tuple):
            for x in a:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    return True
    return False


def _fake_optimizer(optimizer: torch.optim.Optimizer, faker: _Faker, fakes: dict[int, torch.Tensor]):
    """The same optimizer class and hyperparameters over the fake parameters, state included.

    ``foreach=None`` is resolved as torch would for real parameters on the target (it tests
    ``type(p)``, which a fake tensor fails), so the fake step runs the target's kernels.
    """
    groups = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            if id(p) not in fakes:
                raise ValueError(
                    "fake audit: the optimizer holds a tensor that is not a parameter of the model"
                )
            params.append(fakes[id(p)])
        options = {k: v for k, v in group.items() if k != "params"}
        if "foreach" in options and options["foreach"] is None and not options.get("fused"):
            options["foreach"] = not options.get("differentiable", False) and (
                faker.device.type in foreach_supported_devices()
            )
        groups.append({"params": params, **options})
    fake_opt = type(optimizer)(groups, **optimizer.defaults)
    for p, state in optimizer.state.items():
        if id(p) in fakes:
            fake_opt.state[fakes[id(p)]] = {
                k: faker.like_param(v, p) if isinstance(v, torch.Tensor) else v
                for k, v in state.items()
            }
    return fake_opt


def fake_audit(step: Step, *, device=None, dtype=None, strict: bool = False, record_source: bool = False) -> Audit:
    """``step`` on fake copies of its model's state, its inputs and the tensors in its keyword
    arguments; see :func:`auditor.audit`."""
    model, inputs, kwargs, optimizer = step.model, step.inputs, dict(step.kwargs), step.optimizer
    is_module = isinstance(model, torch.nn.Module)
    params = dict(model.named_parameters()) if is_module else {}
    buffers = dict(model.named_buffers()) if is_module else {}
    state = [*params.values(), *buffers.values()]
    if not state:  # no state: the inputs say where the model runs
        state = [t for t in _tensors((inputs, kwargs)) if t.device.type != "meta"][:1]
    target = resolve_device(device, state)
    dtype = resolve_dtype(dtype)

    # constants that are plain tensor attributes of a module become fake constants; a plain
    # function gets no such leniency, since a real tensor it captured could be a real parameter
    require("fake")
    mode = FakeTensorMode(allow_non_fake_inputs=is_module)
    faker = _Faker(mode, target, dtype)
    fake_state = {n: faker(p, param=True) for n, p in params.items()}
    fake_state.update({n: faker(b) for n, b in buffers.items()})
    fake_inputs = pytree.tree_map_only(torch.Tensor, faker, inputs)
    fake_kwargs = pytree.tree_map_only(torch.Tensor, faker, kwargs)
    fakes = {key: fake for key, (_, fake) in faker.memo.items()}
    fake_opt = _fake_optimizer(optimizer, faker, fakes) if optimizer is not None else None

    shim = _DeviceShim(hide=target.type in _ACCELERATORS)
    # below the recorder: results re-laid out where the target's kernel writes other strides than
    # the meta kernel (asked of the real kernel on CPU, the table on CUDA: _recording/_kernels.py)
    restrider = restrider_for(target.type)
    with mode:
        accumulators = _gradient_accumulators(faker, shim)
        # fake kernels compute nothing: there is no time to record
        fa = FormatAuditor(strict=strict, record_source=record_source)
        with restrider, fa, shim, contextlib.nullcontext() if step.backward else torch.no_grad():
            output = _forward(model, fake_state, fake_inputs, fake_kwargs, is_module)
            if step.backward:
                _backward(loss_to_backward(step.loss_fn or default_loss, output), shim, target)
                if fake_opt is not None:
                    fake_opt.step()
    del accumulators
    return fa.audit._with(kernels=restrider.checks(target.type))


def _gradient_accumulators(faker: _Faker, shim: _DeviceShim) -> list:
    """Every fake leaf's gradient accumulator, made now with its device hidden; the caller keeps
    them alive (autograd holds them weakly) so the forward pass reuses them."""
    shim.hide_all = True
    try:
        with shim:
            return [torch.autograd.graph.get_gradient_edge(t) for _, t in faker.memo.values()
                    if t.requires_grad and t.is_leaf]
    finally:
        shim.hide_all = False


def _forward(model, fake_state: dict, fake_inputs, fake_kwargs: dict, is_module: bool):
    if is_module:
        return torch.func.functional_call(model, fake_state, fake_inputs, fake_kwargs, strict=False)
    try:
        return model(*fake_inputs, **fake_kwargs)
    except AssertionError as exc:
        if "convert all Tensors to FakeTensors" not in str(exc):
            raise
        raise TypeError(
            "fake audit: the model used a real tensor it was not given, such as "
            "the parameters of a module it calls; only the inputs and an nn.Module's "
            "own parameters and buffers are made fake: pass the nn.Module itself"
        ) from exc


def _backward(loss: torch.Tensor, shim: _DeviceShim, target: torch.device) -> None:
    shim.hide_all = True
    try:
        loss.backward()
    except Exception as exc:
        if shim.hide:
            exc.add_note(
                f"fake audit on {target}: during backward, autograd's device queries "
                "are answered 'meta' (auditor._fake._DeviceShim); a backward formula "
                "that builds a tensor from a gradient's device fails this way. "
                "backward=False still audits the forward pass."
            )
        raise
    finally:
        shim.hide_all = False


def _tensors(tree) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    pytree.tree_map_only(torch.Tensor, found.append, tree)
    return found
