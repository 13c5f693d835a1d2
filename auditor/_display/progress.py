"""Progress bars for long work (``tqdm.auto``: a bar on a terminal, a widget in a notebook), with
one switch for the whole package: :data:`ENABLED`, else the ``AUDITOR_PROGRESS`` environment
variable, else tqdm's own rule (``disable=None``: no bar when the output is not a terminal).

tqdm is imported only when a bar is made, so a small audit pays nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

#: ``True``: bars on, also where the output is not a terminal; ``False``: never; ``None`` (the
#: default): the ``AUDITOR_PROGRESS`` environment variable decides, and without it tqdm does.
ENABLED: bool | None = None

OFF_VALUES = ("0", "false", "no", "off")
ON_VALUES = ("1", "true", "yes", "on")

#: Events from which ``Audit.ops()`` shows its stages: about 2 s of analysis. Measured on a
#: 2-core CPU, densenet121 training steps: 44,672 events (146,852 tensor rows) took 2.7 s
#: (facts 1.2 s, flow 0.4 s, classification and causes 1.0 s), 11,168 events 0.65 s.
LARGE_AUDIT = 30_000


def setting(flag: bool | None = None) -> bool | None:
    """``flag`` when given, else :data:`ENABLED`, else ``AUDITOR_PROGRESS`` (``0``/``false``/
    ``no``/``off``: False, ``1``/``true``/``yes``/``on``: True), else None: tqdm decides."""
    if flag is not None:
        return bool(flag)
    if ENABLED is not None:
        return bool(ENABLED)
    value = os.environ.get("AUDITOR_PROGRESS", "").strip().lower()
    return False if value in OFF_VALUES else True if value in ON_VALUES else None


def enabled(flag: bool | None = None) -> bool:
    """Whether bars may be shown at all (not switched off)."""
    return setting(flag) is not False


def bar(total: int | None = None, desc: str = "", flag: bool | None = None, *, work: float | None = None,
        min_work: float = 0, **kwargs):
    """A ``tqdm.auto`` bar of ``total`` steps. It draws nothing (its methods still work) when
    switched off, or when ``work`` (the size of the job, in the caller's unit) is below
    ``min_work``; switched neither on nor off, tqdm's ``disable=None`` rule applies.
    ``leave=False`` unless given: the bar goes when its work is done. Use it as a context
    manager, or call ``close()``."""
    state = setting(flag)
    small = work is not None and work < min_work
    kwargs.setdefault("leave", False)
    kwargs["disable"] = True if state is False or small else (None if state is None else False)
    return _tqdm()(total=total, desc=desc, **kwargs)


@contextlib.contextmanager
def stage(progress, name: str) -> Iterator[None]:
    """One step of ``progress`` (a :func:`bar`): named while it runs, counted once it ends."""
    progress.set_postfix_str(name, refresh=True)
    yield
    progress.update(1)


def _tqdm():
    """``tqdm.auto.tqdm``; without ipywidgets a notebook gets the text bar, without tqdm's
    warning about it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm
    return tqdm
