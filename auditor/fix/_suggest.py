"""Suggested fixes: one concrete change per cause, with the bytes it would save.

Each row of ``Audit.causes()`` gets a fix that removes it and every hotspot it leads to,
forward and backward, chosen from the cause's pattern (:data:`auditor.analysis.PATTERNS`):
a source line to edit, a torch module to swap, a library function to rebind, a weight to
convert or a region to run contiguous. Only fixes that save bytes are suggested.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from .. import analysis
from .._result import Audit
from ..analysis import _patterns as patterns
from ..analysis import fix_generators, register_fix
from ..analysis._causes import WEIGHT as WEIGHT_CAUSE
from ..display import fixes_html, fixes_text
from ..recording import _rules as rules
from ..recording._formats import channels_last_order, logical_order
from ._convert import CHANNELS_LAST_OF_RANK, FORMAT_NAMES
from ._hooks import conv_module, is_conv_module, keep_contiguous, set_conv_format
from ._keep_format import SWAPS, swap_module
from ._source_text import enclosing_function, keep_format_in_line, module_expr, source_line

EDIT, SWAP, FUNCTION, WEIGHT, REGION = (
    "edit source", "swap module", "swap function", "convert weight", "keep region contiguous")
FIX_COLUMNS = [
    "fix", "cause", "pattern", "action", "module", "module_type", "op", "source", "line", "suggestion", "detail",
    "hotspots", "count", "bytes", "hotspot_bytes", "added_bytes", "forward_bytes", "backward_bytes",
    "region",
]
#: Functions a "swap function" fix binds in place of a library's: the text its suggestion
#: names -> the function, and how many positional parameters the replaced one must take.
REBINDS = {"torch.nn.functional.channel_shuffle": (torch.nn.functional.channel_shuffle, 2)}


class Fixes:
    """The result of :func:`suggest_fixes`.

    Attributes:
        frame: one row per fix (columns in :data:`FIX_COLUMNS`), most bytes saved first.
            ``bytes`` is the net saving: ``hotspot_bytes`` (the hotspots it removes, forward and
            backward) less ``added_bytes`` (conversions a region fix moves to its edges).
        hotspots: ``Audit.hotspots()`` with a ``fix`` column naming the fix that removes each.
    """

    def __init__(self, frame: pd.DataFrame, hotspots: pd.DataFrame):
        self.frame = frame
        self.hotspots = hotspots
        self.rebound: list[tuple[object, str, object, object]] = []  # (module, name, old, new) apply() bound

    def __len__(self) -> int:
        return len(self.frame)

    def apply(self, model: nn.Module) -> pd.DataFrame:
        """Apply, in place, the fixes that need no source edit (module swaps, weight
        conversions, regions kept contiguous) and the library functions to swap, which are
        rebound in their module for the whole process (:meth:`restored` puts them back for a
        while; edit the source to keep the fix). Returns one row per fix: ``fix``, ``action``,
        ``applied`` and what was done or what is left to do by hand.

        Raises ``TypeError`` for a model it cannot change in place (TorchScript), before
        changing anything."""
        _check_changeable(model)
        rows = []
        for r in self.frame.itertuples():
            done, what = False, ""
            if r.bytes <= 0:
                what = "skipped: its edges move more bytes than it saves (try auditor.plan_layout)"
            elif r.action == SWAP:
                new = swap_module(model, r.module)
                done, what = True, f"{r.module} is now {type(new).__name__}"
            elif r.action == WEIGHT:
                weight = conv_module(model, r.module).weight
                target = CHANNELS_LAST_OF_RANK[weight.dim()]
                if weight.is_contiguous(memory_format=target) and not weight.is_contiguous():
                    what = f"{r.module}.weight is already {FORMAT_NAMES[target]}: nothing to do"
                else:
                    set_conv_format(model, r.module, target, convert_input=False)
                    done, what = True, f"{r.module}.weight converted"
            elif r.action == REGION:
                convs = [n for n in r.region if is_conv_module(model, n)]
                keep_contiguous(model, convs)
                done, what = bool(convs), f"{', '.join(convs) or 'nothing'} run contiguous"
                if len(convs) < len(r.region):
                    others = ", ".join(n for n in r.region if n not in convs)
                    what += f"; by hand: {others} ran convolutions but are no convolution modules"
            elif r.action == FUNCTION:
                done, what = self._rebind(r.suggestion)
            else:
                what = f"by hand, at {r.source or r.module}: {r.suggestion or r.detail}"
            rows.append({"fix": r.fix, "action": r.action, "applied": done, "detail": what})
        return pd.DataFrame(rows, columns=["fix", "action", "applied", "detail"])

    def _rebind(self, suggestion: str) -> tuple[bool, str]:
        """Bind the replacement a "swap function" suggestion names (``module.func = new``)."""
        target, _, new_name = (part.strip() for part in suggestion.partition("="))
        module_name, _, attr = target.rpartition(".")
        new, arity = REBINDS.get(new_name, (None, 0))
        try:
            module = importlib.import_module(module_name)
            old = getattr(module, attr)
        except (ImportError, AttributeError, ValueError):
            return False, f"by hand: {suggestion} ({target} cannot be found)"
        if any(m is module and a == attr for m, a, _, _ in self.rebound):
            return True, f"{target} already rebound"
        params = [p for p in inspect.signature(old).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if new is None or len(params) != arity:
            return False, f"by hand: {suggestion} (its signature differs: check the arguments)"
        setattr(module, attr, new)
        self.rebound.append((module, attr, old, new))
        return True, f"{target} is now {new_name}, for this process (edit the source to keep it)"

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """The library functions :meth:`apply` rebound, put back for the block: to run or time
        the unfixed model beside the fixed one."""
        for module, attr, old, _ in self.rebound:
            setattr(module, attr, old)
        try:
            yield
        finally:
            for module, attr, _, new in self.rebound:
                setattr(module, attr, new)

    def __str__(self) -> str:
        return fixes_text(self.frame, len(self.hotspots), writes=(EDIT,))

    def __repr__(self) -> str:
        saved = int(self.frame["bytes"].clip(lower=0).sum()) if len(self) else 0
        return f"<Fixes {len(self)} fixes, {saved} bytes to save>"

    def _repr_html_(self) -> str:
        """One table row per fix, for notebooks."""
        return fixes_html(self.frame, len(self.hotspots))


def suggest_fixes(audit: Audit) -> Fixes:
    """One fix for every cause of ``audit`` that has one that saves bytes.

    The fix follows the cause's pattern. In order of preference:

    * ``edit source``: the line to change and what to write there (an explicit
      ``.contiguous()`` becomes ``.contiguous(memory_format=torch.channels_last)``; a channel
      slice, a stack reduced along the stack, an N×C×1×1 map interpolated, a mean over H and
      W, an in-place op on a view, a rebuilt weight: the rewrite that keeps the format). Lines
      need an audit with source lines (the default);
    * ``swap module``: a torch module with no channels_last kernel here, to replace by one that
      keeps the format (:data:`SWAPS`);
    * ``swap function``: a library function to rebind to torch's format-keeping op (a channel
      shuffle written with ``transpose(...).contiguous()`` -> ``F.channel_shuffle``);
    * ``convert weight``: a convolution whose stored weight is in the other format;
    * ``keep region contiguous``: the convolutions around an op that cannot keep the format,
      to run contiguous with :func:`keep_contiguous`, when that moves fewer bytes than it
      saves; its ``bytes`` are net of the conversions moved to the region's edges.

    A claim that an op has no channels_last kernel is made only where ``Audit.coverage()``
    says so for this device and dtype.
    """
    if not isinstance(audit, Audit):
        raise TypeError(f"suggest_fixes expects an auditor.Audit, got {type(audit).__name__}")
    hot = audit.hotspots()
    causes = audit.causes()
    if causes.empty:
        return Fixes(pd.DataFrame(columns=FIX_COLUMNS), hot.assign(fix=pd.Series(dtype="int64")))
    found = audit.analysis()
    ops, view, tracer = found.ops, found.view(), found.tracer
    backward = bool((ops["phase"] == "backward").any())
    rows = []
    for cause in causes.itertuples():
        spec = _fix_for(view, tracer, cause)
        if spec is None:
            continue
        mine = hot[hot["cause"] == cause.cause]
        fwd = int(mine.loc[mine["phase"] == "forward", "bytes"].sum())
        bwd = int(mine.loc[mine["phase"] != "forward", "bytes"].sum())
        removed = int(cause.bytes) if cause.kind == WEIGHT_CAUSE else fwd + bwd
        added = spec.pop("added_bytes", 0) * (2 if backward else 1)  # a region's edges convert gradients too
        if removed - added <= 0:
            continue  # only fixes that help
        rows.append({**spec, "cause": cause.cause, "pattern": cause.pattern, "hotspots": len(mine),
                     "count": int(mine["count"].sum()), "hotspot_bytes": removed, "added_bytes": int(added),
                     "bytes": removed - int(added), "forward_bytes": fwd, "backward_bytes": bwd})
    frame = pd.DataFrame(rows, columns=[c for c in FIX_COLUMNS if c != "fix"])
    frame = frame.sort_values(["bytes", "hotspot_bytes"], ascending=False, kind="stable", ignore_index=True)
    frame.insert(0, "fix", np.arange(1, len(frame) + 1))
    number = dict(zip(frame["cause"], frame["fix"]))
    out_hot = hot.copy()
    out_hot["fix"] = np.array([number.get(c, 0) for c in hot["cause"]], dtype=np.int64)
    return Fixes(frame[FIX_COLUMNS].astype({"fix": "int64", "cause": "int64"}), out_hot)


class _Cause:
    """What every fix rule reads about one cause: its row of ``Audit.causes()`` and its first
    event."""

    def __init__(self, view: analysis.FlowView, tracer: analysis.CauseTracer, row):
        ops = view.ops
        self.view, self.tracer, self.row = view, tracer, row
        self.e = int(row.first_seq)
        self.op, self.module, self.source = row.op, row.module, row.source
        self.module_type = row.module_type
        self.pattern = row.pattern
        self.line = source_line(self.source) if self.source else ""
        self.rank = _rank_of(view, self.e)
        self.cl_name = "channels_last_3d" if self.rank == 5 else "channels_last"
        self.packet = rules.op_packet(self.op)
        e = self.e
        self.what = f"{self.op} ({view.kind[e]} {ops.at[e, 'from_format']} -> {ops.at[e, 'to_format']})"
        self.base = {"module": self.module, "module_type": self.module_type, "op": self.op,
                     "source": self.source, "line": self.line, "suggestion": "", "region": ()}


def _fix_for(view, tracer, row) -> dict | None:
    """The fix for one cause: the first of its pattern's registered generators that has one
    (:func:`auditor.analysis.register_fix`), or None when no fix is known to help."""
    cause = _Cause(view, tracer, row)
    for generate in fix_generators(row.pattern):
        found = generate(cause)
        if found is not None:
            return found
    return None


@register_fix(patterns.CHANNEL_SHUFFLE.name)
def _channel_shuffle_fix(c: _Cause):
    module_name, func = enclosing_function(c.source)
    if module_name and func:
        action, suggestion = FUNCTION, f"{module_name}.{func} = torch.nn.functional.channel_shuffle"
        where = f"{module_name}.{func} is a channel shuffle"
    else:
        action, suggestion = EDIT, "x = torch.nn.functional.channel_shuffle(x, groups)"
        where = f"{func or 'this code'} is a channel shuffle"
    return {
        **c.base, "action": action, "suggestion": suggestion,
        "detail": f"{where} written as view -> transpose -> .contiguous() -> view, which writes "
                  f"contiguous order ({c.what}); torch.nn.functional.channel_shuffle (nn.ChannelShuffle) "
                  f"computes the same values and keeps {c.cl_name}",
    }


@register_fix(patterns.EXPLICIT_COPY.name)
def _explicit_copy_fix(c: _Cause):
    if not c.source:
        return {
            **c.base, "action": EDIT,
            "detail": f"{c.what} in {c.module}: a .contiguous() or .to(memory_format=...) copies the activation "
                      f"to contiguous; give it memory_format=torch.{c.cl_name} (audit with record_source=True "
                      "for the line)",
        }
    fixed = keep_format_in_line(c.line, c.cl_name)
    frm = str(c.view.ops.at[c.e, "from_format"])
    detail = (f"{c.what} copies the activation into contiguous order between two convolutions; "
              f"keep it {c.cl_name}" + (" (or remove the call: its input is already dense "
                                        f"{c.cl_name})" if frm == c.cl_name else ""))
    if not fixed:
        detail += f": give this copy memory_format=torch.{c.cl_name}"
    return {**c.base, "action": EDIT, "suggestion": fixed, "detail": detail}


#: Patterns whose fix is a rewrite of the cause's line, and what to write.
_REWRITES = {
    patterns.CHANNEL_SLICE.name: "x1, x2 = x.split([k, x.shape[1] - k], dim=1)  # instead of x[:, :k], x[:, k:]",
    patterns.STACK_REDUCE.name: "y = a + b  # (or a weighted sum) instead of torch.stack([a, b], 1) reduced over dim 1",
    patterns.NC11_BROADCAST.name: "y = p.expand(-1, -1, h, w).contiguous(memory_format=torch.{cl})  # instead of interpolating p",
    patterns.MEAN_BACKWARD.name: "s = F.avg_pool2d(x, x.shape[-2:])  # instead of x.mean((2, 3), keepdim=True)",
    patterns.INPLACE_VIEW.name: "y = y + z  # instead of y += z on a view",
    patterns.WEIGHT_REBUILT.name: "m = w.permute{to}; f(m.reshape(1, out_channels, -1)).reshape(m.shape).permute{back}"
                      "  # flattened in the {cl} parameter's memory order: a view, the same ops",
    patterns.JOINS.name: "y = f(x4d)  # compute on the {cl} image or a 4-D view of it, not on a reshaped or 3-D copy",
}


@register_fix(*_REWRITES)
def _rewrite_fix(c: _Cause):
    template = _REWRITES[c.pattern]
    suggestion = template.format(cl=c.cl_name, to=channels_last_order(c.rank), back=logical_order(c.rank))
    return {**c.base, "action": EDIT, "suggestion": suggestion, "detail": c.row.fix}


@register_fix(patterns.NO_CL_KERNEL.name)
def _module_swap_fix(c: _Cause):
    if not any(typ.__name__ == c.module_type for typ in SWAPS):
        return None
    factory = next(f for typ, (_, f) in SWAPS.items() if typ.__name__ == c.module_type)
    name = c.module
    return {
        **c.base, "action": SWAP,
        "suggestion": f"{module_expr(name)} = {factory}({module_expr(name)})",
        "detail": f"{c.row.fix} ({c.what}); the replacement computes the same values in the same format",
    }


@register_fix(patterns.WEIGHT_FORMAT.name)
def _conv_weight_fix(c: _Cause):
    return {
        **c.base, "action": WEIGHT,
        "suggestion": f"auditor.fix.convert_conv{c.rank - 2}d_weight_memory_format({module_expr(c.module)}, "
                      f"torch.{c.cl_name})",
        "detail": f"{c.module} stores its weight in another format than it computes in and permutes it every "
                  f"step ({c.what}); store it {c.cl_name}",
    }


@register_fix(patterns.NO_CL_KERNEL.name, patterns.RESHAPE_MERGE.name, patterns.CONV_NO_KERNEL.name,
              patterns.LOSES.name)
def _region_fix(c: _Cause):
    region, added = _region_around(c.view, c.e)
    if not region:
        return None
    names = ", ".join(repr(n) for n in region)
    why = ("a reshape that merges C with another dimension must copy a channels_last tensor"
           if c.pattern == patterns.RESHAPE_MERGE.name else c.row.fix)
    return {
        **c.base, "action": REGION, "region": region,
        "suggestion": f"auditor.fix.keep_contiguous(model, [{names}])",
        "detail": f"{why}: {c.what}; run the convolutions around it contiguous so no copy is needed "
                  f"(or let auditor.plan_layout measure whether that pays)",
        "added_bytes": added,
    }


def _check_changeable(model) -> None:
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("Fixes.apply cannot change a TorchScript module in place: apply the fixes to the "
                        "Python model, then script it again")
    if not isinstance(model, nn.Module):
        raise TypeError(f"Fixes.apply expects an nn.Module, got {type(model).__name__}")


def _rank_of(view: analysis.FlowView, e: int) -> int:
    """The rank of the convolutions' activations around ``e`` (4 or 5): a channel shuffle
    copies a 5-D view of 4-D activations, so ``e``'s own tensors can mislead."""
    nd = view.tensors["ndim"].to_numpy()
    near = sorted(view.upstream_convs(e) | view.downstream_convs(e)) if not view.is_conv[e] else [e]
    for x in near + [e]:
        for r in view.act_rows.get(x, []):
            if nd[r] in (4, 5):
                return int(nd[r])
    return 4


def _region_around(view: analysis.FlowView, c: int) -> tuple[tuple[str, ...], int]:
    """The convolutions on both sides of cause ``c`` (found in forward), and the bytes the
    region's edges would then convert, per phase."""
    e = c
    if view.phase[c] != "forward":
        same = np.flatnonzero((view.phase == "forward") & (view.module == view.module[c]) & (view.source == view.source[c]))
        if not len(same):
            return (), 0
        e = int(same[0])
    convs = view.upstream_convs(e) | view.downstream_convs(e)
    if view.is_conv[e]:
        convs |= {e}
    # the modules that ran the convolution ops; Fixes.apply keeps those that are convolution
    # modules (a subclass of nn.Conv2d by any name, not a module calling F.conv2d)
    names = sorted({view.module[x] for x in convs}, key=lambda n: min(x for x in convs if view.module[x] == n))
    if not names:
        return (), 0
    inside = set(names)
    nbytes = view.tensors["bytes"].to_numpy()
    added = 0
    for x in np.flatnonzero((view.phase == "forward") & view.is_conv):
        x = int(x)
        if view.module[x] not in inside:
            continue
        # its input comes from a convolution outside the region: converted at the edge
        if any(view.module[u] not in inside for u in view.upstream_convs(x)):
            added += int(nbytes[view.act_rows[x][0]])
        # its output feeds one outside: converted back at the edge
        if any(view.module[d] not in inside for d in view.downstream_convs(x)):
            added += _output_bytes(view, x)
    return tuple(names), added


def _output_bytes(view: analysis.FlowView, e: int) -> int:
    t = view.tensors
    sel = t[(t["seq"] == e) & (t["role"] == "output") & (t["position"] == 0)]
    return int(sel["bytes"].iloc[0]) if len(sel) else 0
