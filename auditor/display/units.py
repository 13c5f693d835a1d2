"""Numbers for people: bytes and times in engineering units, one style everywhere.

matplotlib's ``EngFormatter`` does the work, so report text, table cells and plot axes agree
("802.8 kB", "404.7 µs").
"""

from __future__ import annotations

import math

from matplotlib.ticker import EngFormatter

#: Formatters for plot axes (``ax.xaxis.set_major_formatter(BYTES)``).
BYTES = EngFormatter(unit="B", places=1)
SECONDS = EngFormatter(unit="s", places=1)


def format_bytes(n: float) -> str:
    """``802800`` -> ``802.8 kB``."""
    return BYTES.format_eng(float(n))


def format_us(us: float) -> str:
    """A time in microseconds -> ``404.7 µs``, ``58.4 ms``; NaN -> ``-``."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "-"
    return SECONDS.format_eng(float(us) * 1e-6)
