"""Numbers for people: bytes and times in engineering units, one style everywhere.

matplotlib's ``EngFormatter`` does the work, so report text, table cells and plot axes agree
("802.8 kB", "404.7 µs"); matplotlib is imported when the first number is written, and the axes'
formatters (:mod:`._axes`) only by a figure.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.ticker import Formatter


@functools.cache
def _text_formatter(unit: str):
    """The one formatter of ``unit`` for text (a formatter binds to the axis it formats, so axes
    get their own from :meth:`Quantity.axis_formatter`)."""
    from matplotlib.ticker import EngFormatter

    return EngFormatter(unit=unit, places=1)


def _eng(unit: str, x: float) -> str:
    """``x`` as a number, prefix and ``unit`` (``format_eng`` leaves the unit out before
    matplotlib 3.8: ``69.4 m``, ``5.0 ``)."""
    s = _text_formatter(unit).format_eng(x)
    return s if s.endswith(unit) else s + unit


def format_bytes(n: float) -> str:
    """``802800`` -> ``802.8 kB``; nothing is ``0 B``, not ``0.0 B``."""
    return "0 B" if n == 0 else _eng("B", float(n))


def format_us(us: float) -> str:
    """A time in microseconds -> ``404.7 µs``, ``58.4 ms``; no time is ``0 s``; NaN -> ``-``."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "-"
    return "0 s" if us == 0 else _eng("s", float(us) * 1e-6)


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
        from ._axes import axis_formatter

        return axis_formatter(self.unit, self.scale)

    def format_axis(self, axis: Axis) -> None:
        """Ticks of ``axis`` (``ax.xaxis``, a colourbar's ``cbar.ax.yaxis``) in this unit;
        counts get integer ticks only."""
        from ._axes import format_axis

        format_axis(axis, self.unit, self.scale)


#: The value kinds figures know, by name: ``bytes`` (permuted bytes), ``count`` (hotspot ops),
#: ``time_us`` (kernel time in µs, stored in µs and read in s).
QUANTITIES = {
    "bytes": Quantity("bytes moved", format_bytes, unit="B"),
    "count": Quantity("hotspot ops", lambda n: f"{int(n)}"),
    "time_us": Quantity("time", format_us, unit="s", scale=1e-6),
}
