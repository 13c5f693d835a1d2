"""Numbers for people: bytes and times in engineering units, one style everywhere.

matplotlib's ``EngFormatter`` does the work, so report text, table cells and plot axes agree
("802.8 kB", "404.7 µs").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.axis import Axis
from matplotlib.ticker import EngFormatter, Formatter, MaxNLocator, StrMethodFormatter

#: Formatters for text only: a formatter binds to the axis it formats, so axes get their own
#: from :meth:`Quantity.axis_formatter`.
BYTES = EngFormatter(unit="B", places=1)
SECONDS = EngFormatter(unit="s", places=1)


def format_bytes(n: float) -> str:
    """``802800`` -> ``802.8 kB``; nothing is ``0 B``, not ``0.0 B``."""
    return "0 B" if n == 0 else BYTES.format_eng(float(n))


def format_us(us: float) -> str:
    """A time in microseconds -> ``404.7 µs``, ``58.4 ms``; no time is ``0 s``; NaN -> ``-``."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "-"
    return "0 s" if us == 0 else SECONDS.format_eng(float(us) * 1e-6)


@dataclass(frozen=True)
class Quantity:
    """One kind of value a figure shows (bytes, a count, a time): how it reads as text and
    on an axis, so that adding a kind is one entry in :data:`QUANTITIES`, not a change to every
    figure."""

    label: str  #: axis and colourbar label
    text: Callable[[float], str]  #: a stored value as text, exactly as the report writes it
    unit: str | None = None  #: ``EngFormatter``'s unit for axis ticks; None: plain integers
    scale: float = 1.0  #: stored value × scale = value in ``unit`` (µs -> s)

    def axis_formatter(self) -> Formatter:
        """A new formatter for one axis: matplotlib binds a formatter to the axis it formats, so
        two axes must not share one. Engineering units never print an offset such as ``1e7``."""
        if self.unit is None:
            return StrMethodFormatter("{x:,.0f}")
        return _ScaledEngFormatter(unit=self.unit, scale=self.scale)

    def format_axis(self, axis: Axis) -> None:
        """Ticks of ``axis`` (``ax.xaxis``, a colourbar's ``cbar.ax.yaxis``) in this unit;
        counts get integer ticks only."""
        if self.unit is None:
            axis.set_major_locator(MaxNLocator(integer=True))
        axis.set_major_formatter(self.axis_formatter())


class _ScaledEngFormatter(EngFormatter):
    """``EngFormatter`` for data stored in a sub-unit (times are stored in µs, read in s), whose
    ticks read in one prefix (``0 ms``, ``20 ms``, not ``0 s``, ``20 ms``)."""

    def __init__(self, unit: str, scale: float = 1.0):
        super().__init__(unit=unit)
        self.scale = scale

    def format_data(self, value):
        return super().format_data(value * self.scale)

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


#: The value kinds figures know, by name: ``bytes`` (permuted bytes), ``count`` (hotspot ops),
#: ``time_us`` (kernel time in µs, stored in µs and read in s).
QUANTITIES = {
    "bytes": Quantity("bytes moved", format_bytes, unit="B"),
    "count": Quantity("hotspot ops", lambda n: f"{int(n)}"),
    "time_us": Quantity("time", format_us, unit="s", scale=1e-6),
}
