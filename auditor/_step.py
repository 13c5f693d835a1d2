"""One step of a model: what an audit records, a fake audit replays, a layout plan and the timing
harness time, and a fix verification runs before and after.

A step is the forward pass ``model(*inputs, **kwargs)``, then, with ``backward``,
``loss_fn(output).backward()`` (the default loss sums every floating output) and
``optimizer.step()``. A forward-only step runs under ``torch.no_grad()``: it builds no autograd
graph that nothing would use, as inference does.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(model)``, also for a model that keeps tensors of its last step that are
    not graph leaves in a plain attribute (a cache such as RAFT's correlation pyramid), which
    deepcopy refuses: each is copied detached, as the state of a model at rest would be."""
    memo: dict[int, object] = {}
    for module in model.modules():
        for key, value in vars(module).items():
            if key not in ("_parameters", "_buffers", "_modules"):
                _detach_into(memo, value, depth=0)
    return copy.deepcopy(model, memo)


def _detach_into(memo: dict[int, object], value, depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if not value.is_leaf:
            memo[id(value)] = value.detach().clone()
    elif depth < 4 and isinstance(value, (list, tuple)):
        for v in value:
            _detach_into(memo, v, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for v in value.values():
            _detach_into(memo, v, depth + 1)


def default_loss(output) -> torch.Tensor:
    """The loss of a step when none is given: the sum of every floating output."""
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        parts = [o.float().sum() for o in output if isinstance(o, torch.Tensor) and o.is_floating_point()]
        if parts:
            return torch.stack(parts).sum()
    raise TypeError(
        f"cannot make a loss from a model output of type {type(output).__name__}; pass loss_fn="
    )


def check_kwargs(kwargs) -> dict:
    """The model's keyword arguments as a dict; anything but a Mapping (or None) is refused."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping of keyword arguments for the model, got {type(kwargs).__name__}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(f"kwargs keys must be argument names (str), got {bad[0]!r}")
    return dict(kwargs)


def loss_to_backward(loss_fn: Callable, output) -> torch.Tensor:
    """``loss_fn(output)``, checked: a step's backward needs something that requires grad."""
    loss = loss_fn(output)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise ValueError(
            "backward=True, but the loss requires grad on nothing: give the model trainable "
            "parameters or inputs that require grad, or pass backward=False"
        )
    return loss


@dataclass(frozen=True)
class Step:
    """One step of ``model`` on ``inputs``: a plain value, made once and run anywhere.

    ``gradient``, when given, is passed to ``loss.backward()`` (a loss that is no scalar: one
    layer's output with its upstream gradient).
    """

    model: Callable
    inputs: tuple = ()
    kwargs: Mapping = field(default_factory=dict)
    backward: bool = True  # forward, then loss_fn(output).backward() and optimizer.step()
    loss_fn: Callable | None = None  # None: default_loss
    optimizer: torch.optim.Optimizer | None = None  # stepped after backward
    gradient: torch.Tensor | None = None  # for a loss that is no scalar

    def __post_init__(self):
        if not callable(self.model):
            raise TypeError(f"model must be callable, got {type(self.model).__name__}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "kwargs", check_kwargs(self.kwargs))

    def run(self) -> object:
        """The step, once; returns the model's output."""
        if not self.backward:
            with torch.no_grad():
                return self.model(*self.inputs, **self.kwargs)
        output = self.model(*self.inputs, **self.kwargs)
        loss_to_backward(self.loss_fn or default_loss, output).backward(self.gradient)
        if self.optimizer is not None:
            self.optimizer.step()
        return output

    def warm_up(self, steps: int) -> None:
        """Run the step ``steps`` times, then give every gradient back the value it had before
        (None for a fresh model): the step that follows sees the gradients it would have seen
        without the warm-up, so it records the same ops (a first backward stores new gradients,
        a later one adds into them)."""
        if steps <= 0:
            return
        leaves = self._leaves()
        grads = [t.grad for t in leaves]
        for _ in range(steps):
            self.run()
        for t, g in zip(leaves, grads):
            t.grad = g

    def _leaves(self) -> list[torch.Tensor]:
        """The tensors whose .grad a backward step writes: the model's trainable parameters and
        the inputs that require grad."""
        params = [p for p in self.model.parameters() if p.requires_grad] if isinstance(self.model, torch.nn.Module) else []
        return params + [t for t in (*self.inputs, *self.kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad]

    def timed(self) -> Callable[[], object]:
        """The step as a callable to time over and over: each call first drops the gradients
        the previous one left (on the model's parameters and the inputs), so none accumulates."""
        if not self.backward:
            return self.run
        leaves = self._leaves()

        def step():
            for t in leaves:
                t.grad = None
            return self.run()
        return step

    def replace(self, **changes) -> Step:
        """This step with some fields changed (another model, other inputs)."""
        return dataclasses.replace(self, **changes)

    def call(self, model: Callable | None = None) -> Callable:
        """A callable of the positional inputs alone that calls ``model`` (this step's by
        default) with this step's keyword arguments: for code that calls ``fn(*inputs)``."""
        model = self.model if model is None else model
        if not self.kwargs:
            return model
        kwargs = self.kwargs

        def call(*inputs):
            return model(*inputs, **kwargs)
        return call
