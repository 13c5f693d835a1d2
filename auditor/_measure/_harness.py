"""The timing harness: interleaved medians on a chosen clock, and steady memory to time on.

Candidates are timed in rounds (A B C, C B A, ...) so that load from other processes hits every
one alike; a fast callable runs several times per sample so that one sample lasts at least a
minimum time.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import torch

from ._decide import MIN_ROUNDS, median_interval, ratios

try:
    import resource
except ImportError:  # not on Windows: no page-fault counts
    resource = None


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_malloc() -> bool:
    """Keep glibc from handing freed memory back to the OS between steps (process-wide).

    By default glibc trims the top of the heap and maps large blocks afresh, so a model whose
    tensors land on the wrong side of those thresholds page-faults its activations anew every
    step. Measured here: one of three copies of convnext_tiny with identical layouts took 29,000
    minor page faults and 20-30% more CPU time per training step, in the same process, and
    which copy lost changed from run to run. Call this once before timing anything; returns
    False where the C library is not glibc. Not called by :func:`plan_layout` itself.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(mallopt(m_trim_threshold, 1 << 30))


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where the platform cannot say)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block at ``threads`` intra-op threads (None: as it is), giving the caller's count
    back afterwards, whatever is raised. One thread is how audits and ``Fixes.verify`` time: on a
    busy machine a step at several threads spends its OpenMP regions waiting for descheduled
    threads, and process CPU time is the work done only at one."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_clock(device: torch.device | str = "cpu") -> str:
    """``cpu`` (process CPU time) for a single-threaded CPU run, else ``wall``.

    With one thread, CPU time is the work done, and preemption by other processes on a shared
    machine does not inflate it the way it inflates wall time; with several threads it would
    also count the threads' spin-waiting, so wall time is the only honest clock.
    """
    return "cpu" if torch.device(device).type == "cpu" and torch.get_num_threads() == 1 else "wall"


def sample(name: str, fn: Callable[[], object], number: int, device: torch.device) -> tuple[float, float, float]:
    """One sample: ``fn`` called ``number`` times; (wall µs, process CPU µs, minor page faults),
    each per call. ``name`` is the candidate's name (tests replace this function to inject
    times)."""
    sync(device)
    f0, t0, c0 = minor_faults(), time.perf_counter(), time.process_time()
    for _ in range(number):
        fn()
    sync(device)
    return ((time.perf_counter() - t0) * 1e6 / number, (time.process_time() - c0) * 1e6 / number,
            (minor_faults() - f0) / number)


class Rounds:
    """Samples of several callables taken in interleaved rounds, each in the reverse order of the
    one before (A B C, C B A, A B C, ...) so that none always runs first; kept so that more rounds
    can be added until a decision is clear (:mod:`auditor._plan._decide`).

    Each callable is warmed up once and calibrated so that one sample lasts at least
    ``min_sample_us``; ``wall[name]``, ``cpu[name]`` and ``faults[name]`` hold one value per
    round (per call).
    """

    def __init__(self, fns: dict[str, Callable[[], object]], *, min_sample_us: float = 1000.0,
                 device: torch.device | str = "cpu"):
        self.fns = dict(fns)
        self.device = torch.device(device)
        self.number = {}
        for name, fn in self.fns.items():
            fn()  # warm-up: allocator, kernels, lazy init
            sync(self.device)
            t0 = time.perf_counter()
            fn()
            sync(self.device)
            once = (time.perf_counter() - t0) * 1e6
            self.number[name] = max(1, math.ceil(min_sample_us / max(once, 1.0)))
        self.wall: dict[str, list[float]] = {name: [] for name in self.fns}
        self.cpu: dict[str, list[float]] = {name: [] for name in self.fns}
        self.faults: dict[str, list[float]] = {name: [] for name in self.fns}

    def __len__(self) -> int:
        """Rounds taken so far."""
        return min((len(v) for v in self.wall.values()), default=0)

    def run(self, rounds: int) -> Rounds:
        """Take ``rounds`` more rounds; returns ``self``."""
        order = list(self.fns.items())
        for r in range(len(self), len(self) + rounds):
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                w, c, f = sample(name, fn, self.number[name], self.device)
                self.wall[name].append(w)
                self.cpu[name].append(c)
                self.faults[name].append(f)
        return self

    def times(self, clock: str) -> dict[str, list[float]]:
        """Per callable, its samples on ``clock`` (``wall`` or ``cpu``), one per round."""
        return {"wall": self.wall, "cpu": self.cpu}[clock]

    def frame(self) -> pd.DataFrame:
        """One row per callable: medians, spreads and faults, as :func:`time_interleaved`."""
        rows = []
        for name in self.fns:
            row = {"name": name, "faults": statistics.median(self.faults[name]) if self.faults[name] else 0.0}
            for clock in ("wall", "cpu"):
                samples = self.times(clock)[name]
                med = statistics.median(samples) if samples else float("nan")
                row[f"{clock}_us"] = med
                row[f"{clock}_spread"] = spread(samples)
            rows.append(row)
        return pd.DataFrame(rows).set_index("name")


def spread(samples: list[float]) -> float:
    """Interquartile range over the median (0 for fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    q1, q3 = np.percentile(samples, [25, 75])
    return float((q3 - q1) / med) if med else 0.0


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch at ``n`` threads for the block (None: as it is). At one thread, process CPU time
    is the work done, whatever else the machine runs (:func:`default_clock`)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: ``time_interleaved``'s verdicts of each callable against the first.
FASTER, SLOWER, WITHIN_NOISE, BASELINE = "faster", "slower", "within noise", "baseline"


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int = 7, *, min_sample_us: float = 1000.0,
                     device: torch.device | str = "cpu", threads: int | None = 1) -> pd.DataFrame:
    """Time each callable ``repeats`` times, interleaved (A B C, C B A, ...) so that load from
    other processes hits every candidate alike, at ``threads`` torch threads (default one, as the
    benchmarks: on a CPU the clock is then process CPU time; None keeps torch's setting and, with
    several threads, the wall clock). A fast callable runs several times per sample so that one
    sample lasts at least ``min_sample_us``.

    Returns one row per callable: ``us`` (median per call on ``clock``, :func:`default_clock`
    at those threads), ``ratio`` (the median over rounds of its time over the first callable's
    in the same round), ``ratio_low``/``ratio_high`` (that median's distribution-free interval,
    :func:`~auditor._measure.median_interval`), ``verdict`` (``faster`` or ``slower`` than the
    first when the whole interval lies on one side of 1, else ``within noise``; the first is the
    ``baseline``), ``rounds``, ``clock``, ``threads``, and from the same samples ``wall_us`` and ``cpu_us``,
    ``wall_spread``, ``cpu_spread`` (interquartile range over median) and ``faults`` (median
    minor page faults per call: above zero, the allocator is returning memory to the OS between
    calls, see :func:`steady_malloc`).
    """
    with torch_threads(threads):
        clock, used = default_clock(device), torch.get_num_threads()
        taken = Rounds(fns, min_sample_us=min_sample_us, device=device).run(repeats)
    return _paired(taken, clock).assign(threads=used)


def _paired(taken: Rounds, clock: str) -> pd.DataFrame:
    """``taken``'s frame with each callable's time on ``clock`` and its paired ratios to the first."""
    frame = taken.frame()
    times = taken.times(clock)
    first = next(iter(times))
    rows = []
    for name, samples in times.items():
        paired = ratios(samples, times[first])
        low, high = median_interval(paired)
        ratio = statistics.median(paired) if paired else float("nan")
        verdict = (BASELINE if name == first else FASTER if len(paired) >= MIN_ROUNDS and high < 1
                   else SLOWER if len(paired) >= MIN_ROUNDS and low > 1 else WITHIN_NOISE)
        rows.append({"us": frame.at[name, f"{clock}_us"], "ratio": ratio, "ratio_low": low, "ratio_high": high,
                     "verdict": verdict, "rounds": len(paired), "clock": clock})
    return pd.DataFrame(rows, index=frame.index).join(frame)


def median_times(fns: dict[str, Callable[[], object]], repeats: int = 7, *, min_sample_us: float = 1000.0,
                 device: torch.device | str = "cpu", clock: str | None = None) -> dict[str, float]:
    """Median time per call of each callable in µs, on ``clock`` (``wall`` or ``cpu``; default
    :func:`default_clock`), measured in interleaved rounds at the caller's threads (a plan
    times everything at the threads it runs at)."""
    clock = clock or default_clock(device)
    taken = Rounds(fns, min_sample_us=min_sample_us, device=device).run(repeats)
    return {name: statistics.median(v) for name, v in taken.times(clock).items()}
