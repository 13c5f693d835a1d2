"""Axis ticks in the units of :mod:`._units` (matplotlib, imported with this module: only
figures need it)."""

from __future__ import annotations

import math

from matplotlib.axis import Axis
from matplotlib.ticker import EngFormatter, Formatter, MaxNLocator, StrMethodFormatter


def axis_formatter(unit: str | None, scale: float = 1.0) -> Formatter:
    """A new formatter for one axis in ``unit`` (None: plain integers), for values stored in
    ``unit`` divided by ``scale`` (µs for seconds: ``scale=1e-6``)."""
    if unit is None:
        return StrMethodFormatter("{x:,.0f}")
    return _ScaledEngFormatter(unit=unit, scale=scale)


def format_axis(axis: Axis, unit: str | None, scale: float = 1.0) -> None:
    """Ticks of ``axis`` in ``unit``; counts (no unit) get integer ticks only."""
    if unit is None:
        axis.set_major_locator(MaxNLocator(integer=True))
    axis.set_major_formatter(axis_formatter(unit, scale))


class _ScaledEngFormatter(EngFormatter):
    """``EngFormatter`` for data stored in a sub-unit (times are stored in µs, read in s), whose
    ticks read in one prefix (``0 ms``, ``20 ms``, not ``0 s``, ``20 ms``)."""

    def __init__(self, unit: str, scale: float = 1.0):
        super().__init__(unit=unit)
        self.scale = scale

    def __call__(self, x, pos=None):
        # scaled here, not in format_data, which matplotlib before 3.8 never calls from here
        return super().__call__(x * self.scale, pos)

    def format_ticks(self, values):
        """All ticks in one prefix, that of the largest tick shown (``0 ms``, ``0.5 ms``, ``1 ms``,
        not ``0 s``, ``500 µs``, ``1 ms``): the locator's ticks run past the axis' ends, so only
        those inside it choose."""
        scaled = [v * self.scale for v in values]
        lo, hi = sorted(self.axis.get_view_interval()) if self.axis is not None else (min(values), max(values))
        span = max(abs(hi - lo), 1e-300)
        shown = [abs(x) for v, x in zip(values, scaled) if x and lo - 1e-9 * span <= v <= hi + 1e-9 * span]
        if not shown:
            return super().format_ticks(values)
        exp = min(max(int(math.floor(math.log10(max(shown)) / 3) * 3), min(self.ENG_PREFIXES)), max(self.ENG_PREFIXES))
        unit = f"{self.ENG_PREFIXES[exp]}{self.unit}"
        return [f"{x / 10 ** exp:.3g} {unit}" for x in scaled]
