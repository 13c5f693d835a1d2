"""Models and probes for the recorder's fault tests (``test_faults.py``): what a recording must
survive (other threads, checkpointing, deep nesting, tensors without strides) and the global
state it must leave as it found it."""

from __future__ import annotations

import sys
import textwrap
import threading

import torch
import torch.nn as nn
from torch.optim import optimizer as optim_mod
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint

CL = torch.channels_last


class CountingMode(TorchDispatchMode):
    """A bare mode: the ops any Python dispatch mode sees, in order."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def global_state() -> dict:
    """Everything a recording installs while it runs: the dispatch-mode stack, every global
    module and optimizer hook dictionary, the recursion limit and the profiler."""
    modules = torch.nn.modules.module
    hooks = {name: list(getattr(modules, name)) for name in dir(modules)
             if name.startswith("_global_") and isinstance(getattr(modules, name), dict)}
    hooks.update({name: list(getattr(optim_mod, name)) for name in dir(optim_mod)
                  if name.startswith("_global_optimizer") and isinstance(getattr(optim_mod, name), dict)})
    return {"modes": [id(m) for m in _get_current_dispatch_mode_stack()], "hooks": hooks,
            "recursion_limit": sys.getrecursionlimit(), "profiler": torch.autograd._profiler_enabled()}


# -- threads --------------------------------------------------------------------------------


class Alien(nn.Module):
    """A model of another thread, with module names the recorded model does not have."""

    def __init__(self):
        super().__init__()
        self.alien_conv = nn.Conv2d(3, 3, 1)
        self.alien_act = nn.Tanh()

    def forward(self, x):
        return self.alien_act(self.alien_conv(x))


class ForeignThreads:
    """Threads that run their own model, forward and backward, until stopped; ``calls`` counts
    their module calls."""

    def __init__(self, n: int = 2):
        self.stop = threading.Event()
        self.calls = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self):
        try:
            model, x = Alien(), torch.randn(1, 3, 8, 8, requires_grad=True)
            while not self.stop.is_set():
                model(x).sum().backward()
                self.calls += 1
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            self.errors.append(exc)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


class Level(nn.Module):
    """One level of a nested, reentrant-checkpointed chain; past the engine's reentrant depth
    (60) its backward runs on the engine's worker threads."""

    def __init__(self, inner: nn.Module | None):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = inner

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        return checkpoint(self.inner, y, use_reentrant=True) if self.inner is not None else y * 2


class ThreadOf(torch.autograd.Function):
    """Identity whose backward notes the thread the engine ran it on."""

    threads: set[int] = set()

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ThreadOf.threads.add(threading.get_ident())
        return grad


class NotedLevel(Level):
    def forward(self, x):
        return super().forward(ThreadOf.apply(x))


def nested_checkpoints(depth: int, noted: bool = False) -> nn.Module:
    model = None
    for _ in range(depth):
        model = (NotedLevel if noted else Level)(model)
    return model


# -- checkpointing --------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.conv(x))


class Checkpointed(nn.Module):
    """Two checkpointed blocks between an unchecked stem and head."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.a = Block(4)
        self.b = Block(4)
        self.head = nn.Conv2d(4, 2, 1)
        self.use_reentrant = use_reentrant

    def forward(self, x):
        x = self.stem(x)
        x = checkpoint(self.a, x, use_reentrant=self.use_reentrant)
        x = checkpoint(self.b, x, use_reentrant=self.use_reentrant)
        return self.head(x)


# -- deep models ----------------------------------------------------------------------------


class Wrap(nn.Module):
    """Each level wraps the next and calls it from its own forward: Python recursion."""

    def __init__(self, inner: nn.Module | None):
        super().__init__()
        self.inner = inner
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        x = x * self.scale
        return self.inner(x) if self.inner is not None else x


class Link(nn.Module):
    """A module tree as deep as its chain; the root walks the chain in a loop, so only the
    tree is deep, not the calls."""

    def __init__(self, next_link: nn.Module | None):
        super().__init__()
        self.next = next_link
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.scale


class Chain(nn.Module):
    def __init__(self, depth: int):
        super().__init__()
        link = None
        for _ in range(depth):
            link = Link(link)
        self.first = link

    def forward(self, x):
        link = self.first
        while link is not None:
            x = link(x)
            link = link.next
        return x


def wrapped(depth: int) -> nn.Module:
    model = None
    for _ in range(depth):
        model = Wrap(model)
    return model


# -- keyword arguments ----------------------------------------------------------------------


class Masked(nn.Module):
    """A model whose forward takes keyword arguments, one of them a tensor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, *, mask, scale=1.0):
        return self.conv(x) * mask * scale


#: A models file for the command line's tests: factories that build, fail to build, and whose
#: models fail in forward.
CLI_FACTORIES = textwrap.dedent(
    """
    import torch.nn as nn

    def small():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softmax(dim=1), nn.Conv2d(8, 8, 3, padding=1))

    def clean():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))

    def broken():
        raise RuntimeError("no weights here")

    class LooksUpAKey(nn.Module):
        def forward(self, x):
            return {"y": x}["x"]

    class Asserts(nn.Module):
        def forward(self, x):
            assert x.shape[1] == 4, "wants 4 channels"
            return x

    def key_error():
        return LooksUpAKey()

    def assertion():
        return Asserts()

    NOT_A_FACTORY = 3
    """
)
