"""Suggested fixes: one concrete change per cause, with the bytes it would save.

Each hotspot is traced to its cause (:class:`auditor.analysis.CauseTracer`); one fix covers a
cause and every hotspot it leads to, forward and backward. The fix rules are tried in order
(:data:`_RULES`), each on the cause's op, its data flow and its source line.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch.nn as nn

from .. import analysis
from ..display.tables import preformatted_html
from ..display.units import format_bytes
from ..recording import rules
from ..recording.formats import base_format
from ..result import Audit
from .convert import CHANNELS_LAST_OF_RANK
from .hooks import conv_module, keep_contiguous, set_conv_format
from .keep_format import SWAPS, swap_module
from .source import enclosing_function, function_of, keep_format_in_line, module_expr, source_line

EDIT, SWAP, FUNCTION, WEIGHT, REGION = (
    "edit source", "swap module", "swap function", "convert weight", "keep region contiguous")
FIX_COLUMNS = [
    "fix", "action", "module", "module_type", "op", "source", "line", "suggestion", "detail",
    "hotspots", "count", "bytes", "hotspot_bytes", "added_bytes", "forward_bytes", "backward_bytes",
    "region",
]
_RESHAPES = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.flatten")


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

    def __len__(self) -> int:
        return len(self.frame)

    def apply(self, model: nn.Module) -> pd.DataFrame:
        """Apply, in place, the fixes that need no source edit (module swaps, weight
        conversions, regions kept contiguous) and save bytes; a region whose edges would move
        more bytes than it saves is left out. Returns one row per fix: ``fix``, ``action``,
        ``applied`` and what was done or what is left to do by hand."""
        rows = []
        for r in self.frame.itertuples():
            done, what = False, ""
            if r.bytes <= 0:
                what = "skipped: its edges move more bytes than it saves (try auditor.plan_layout)"
            elif r.action == SWAP:
                new = swap_module(model, r.module)
                done, what = True, f"{r.module} is now {type(new).__name__}"
            elif r.action == WEIGHT:
                rank = conv_module(model, r.module).weight.dim()
                set_conv_format(model, r.module, CHANNELS_LAST_OF_RANK[rank], convert_input=False)
                done, what = True, f"{r.module}.weight converted"
            elif r.action == REGION:
                keep_contiguous(model, r.region)
                done, what = True, f"{', '.join(r.region)} run contiguous"
            else:
                what = f"by hand, at {r.source or r.module}: {r.suggestion or r.detail}"
            rows.append({"fix": r.fix, "action": r.action, "applied": done, "detail": what})
        return pd.DataFrame(rows, columns=["fix", "action", "applied", "detail"])

    def __str__(self) -> str:
        f = self.frame
        if f.empty:
            return "Suggested fixes: none (no hotspots)."
        lines = [
            f"Suggested fixes: {len(f)} for {len(self.hotspots)} hotspot groups, "
            f"{format_bytes(f['bytes'].clip(lower=0).sum())} to save "
            f"(forward {format_bytes(f['forward_bytes'].sum())}, backward {format_bytes(f['backward_bytes'].sum())} "
            "of hotspots)",
        ]
        for r in f.itertuples():
            where = r.source or r.module
            lines.append("")
            lines.append(
                f"{r.fix}. {r.action}: {where}  ({r.module}, {r.module_type or '-'})  "
                f"saves {format_bytes(r.bytes)} ({r.hotspots} hotspot group{'s' if r.hotspots != 1 else ''})"
            )
            if r.line:
                lines.append(f"     now:   {r.line.strip()}")
            if r.suggestion:
                label = "write:" if r.action == EDIT else "do:   "
                lines.append(f"     {label} {r.suggestion.strip()}")
            lines.append(f"     why:   {r.detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        saved = int(self.frame["bytes"].clip(lower=0).sum()) if len(self) else 0
        return f"<Fixes {len(self)} fixes, {saved} bytes to save>"

    def _repr_html_(self) -> str:
        return preformatted_html(str(self))


def suggest_fixes(audit: Audit) -> Fixes:
    """One concrete fix for every hotspot of ``audit``, with the bytes it would save.

    Each hotspot is traced back to the op that caused it (a conversion inside a convolution is
    caused by whatever wrote its operand in the wrong format), and one fix covers a cause and
    every hotspot it causes, forward and backward. The fix is, in order of preference:

    * ``edit source``: the line with a ``.contiguous()`` (or ``contiguous_format``) and what to
      write there instead (needs an audit with ``record_source=True``);
    * ``swap module``: the module to replace by one that keeps the format (:data:`SWAPS`);
    * ``swap function``: a library function to rebind to torch's format-keeping op (a channel
      shuffle written with ``transpose(...).contiguous()`` -> ``F.channel_shuffle``);
    * ``keep region contiguous``: the convolutions around an op that cannot keep the format
      (a reshape that merges C, an op without a channels_last kernel), to run contiguous with
      :func:`keep_contiguous`; its ``bytes`` are net of the conversions moved to the edges.
    """
    if not isinstance(audit, Audit):
        raise TypeError(f"suggest_fixes expects an auditor.Audit, got {type(audit).__name__}")
    hot = audit.hotspots()
    if hot.empty:
        return Fixes(pd.DataFrame(columns=FIX_COLUMNS), hot.assign(fix=pd.Series(dtype="int64")))
    ops = audit.ops()
    view = analysis.FlowView(ops, audit.flow())
    hot_events = np.flatnonzero(ops["hotspot"].to_numpy())
    root = _forward_causes(view, analysis.CauseTracer(view).causes_of(hot_events))
    fixes: dict[tuple, dict] = {}
    event_fix: dict[int, tuple] = {}
    for e, c in root.items():
        key, spec = _fix_for(view, c)
        fixes.setdefault(key, spec)
        event_fix[e] = key
    keys = analysis.HOTSPOT_KEYS
    hot_keys = hot[keys].astype(str).apply(tuple, axis=1)
    group_fix: dict[tuple, tuple] = {}
    for e, g in zip(hot_events, ops.loc[hot_events, keys].astype(str).apply(tuple, axis=1)):
        group_fix.setdefault(g, event_fix[int(e)])
    frame = _fix_frame(fixes, group_fix, hot, hot_keys, backward=bool((ops["phase"] == "backward").any()))
    number = dict(zip(frame["_key"], frame["fix"]))
    out_hot = hot.copy()
    out_hot["fix"] = [number[group_fix[k]] for k in hot_keys]
    return Fixes(frame[FIX_COLUMNS], out_hot)


def _forward_causes(view: analysis.FlowView, causes: dict[int, int]) -> dict[int, int]:
    """A backward cause belongs to the forward op of its autograd node: the forward cause with
    the same module and line or, failing that, the same module and function (the backward of a
    view next to the copy)."""
    forward_of: dict[tuple, int] = {}
    for c in sorted(set(causes.values())):
        if view.phase[c] == "forward":
            forward_of.setdefault((view.module[c], view.source[c]), c)
            forward_of.setdefault((view.module[c], function_of(view.source[c])), c)
    root = {}
    for e, c in causes.items():
        if view.phase[c] != "forward":
            c = forward_of.get((view.module[c], view.source[c]),
                               forward_of.get((view.module[c], function_of(view.source[c])), c))
        root[e] = c
    return root


def _fix_frame(fixes: dict, group_fix: dict, hot: pd.DataFrame, hot_keys: pd.Series, backward: bool) -> pd.DataFrame:
    """One row per fix with the hotspot bytes it removes, most saved first, numbered."""
    rows = []
    for key, spec in fixes.items():
        mine = [g for g, k in group_fix.items() if k == key]
        sel = hot[hot_keys.isin(mine)]
        fwd = int(sel.loc[sel["phase"] == "forward", "bytes"].sum())
        bwd = int(sel.loc[sel["phase"] != "forward", "bytes"].sum())
        added = spec.pop("added_bytes", 0)
        if added and backward:
            added *= 2  # the region's edges convert gradients too
        rows.append({**spec, "hotspots": len(sel), "count": int(sel["count"].sum()),
                     "hotspot_bytes": fwd + bwd, "added_bytes": int(added), "bytes": fwd + bwd - int(added),
                     "forward_bytes": fwd, "backward_bytes": bwd, "_key": key})
    frame = pd.DataFrame(rows)
    frame = frame.sort_values(["bytes", "hotspot_bytes"], ascending=False, kind="stable", ignore_index=True)
    frame.insert(0, "fix", np.arange(1, len(frame) + 1))
    return frame


class _Cause:
    """What every fix rule reads about one cause event."""

    def __init__(self, view: analysis.FlowView, c: int):
        ops = view.ops
        self.view, self.e = view, c
        self.op, self.module, self.source = view.op[c], view.module[c], view.source[c]
        self.module_type = str(ops.at[c, "module_type"])
        self.frm, self.to = str(ops.at[c, "from_format"]), str(ops.at[c, "to_format"])
        self.line = source_line(self.source) if self.source else ""
        self.rank = _rank_of(view, c)
        self.cl_name = "channels_last_3d" if self.rank == 5 else "channels_last"
        self.packet = rules.op_packet(self.op)
        self.what = f"{self.op} ({view.kind[c]} {self.frm} -> {self.to})"
        self.base = {"module": self.module, "module_type": self.module_type, "op": self.op,
                     "source": self.source, "line": self.line, "suggestion": "", "region": ()}


def _fix_for(view: analysis.FlowView, c: int) -> tuple[tuple, dict]:
    """The fix for cause event ``c``: a key that merges causes one fix removes, and its row."""
    cause = _Cause(view, c)
    for rule in _RULES:
        found = rule(cause)
        if found is not None:
            return found
    raise AssertionError("the region rule always answers")


def _channel_shuffle_fix(c: _Cause):
    if c.packet not in rules.COPY_OPS or not _is_channel_shuffle(c.view, c.e, c.line, c.rank):
        return None
    module_name, func = enclosing_function(c.source)
    if module_name and func:
        action, suggestion = FUNCTION, f"{module_name}.{func} = torch.nn.functional.channel_shuffle"
        where = f"{module_name}.{func} is a channel shuffle"
    else:
        action, suggestion = EDIT, "x = torch.nn.functional.channel_shuffle(x, groups)"
        where = f"{func or 'this code'} is a channel shuffle"
    return ("edit", c.source), {
        **c.base, "action": action, "suggestion": suggestion,
        "detail": f"{where} written as view -> transpose -> .contiguous() -> view, which writes "
                  f"contiguous order ({c.what}); torch.nn.functional.channel_shuffle (nn.ChannelShuffle) "
                  f"computes the same values and keeps {c.cl_name}",
    }


def _explicit_copy_fix(c: _Cause):
    if c.packet not in rules.COPY_OPS or _feeds_reshape(c.view, c.e) or base_format(c.to) != "contiguous":
        return None
    if not c.source:
        return ("edit", c.module, c.op), {
            **c.base, "action": EDIT,
            "detail": f"{c.what} in {c.module}: a .contiguous() or .to(memory_format=...) copies the activation "
                      f"to contiguous; give it memory_format=torch.{c.cl_name} (audit with record_source=True "
                      "for the line)",
        }
    fixed = keep_format_in_line(c.line, c.cl_name)
    detail = (f"{c.what} copies the activation into contiguous order between two convolutions; "
              f"keep it {c.cl_name}" + (" (or remove the call: its input is already dense "
                                        f"{c.cl_name})" if c.frm == c.cl_name else ""))
    if not fixed:
        detail += f": give this copy memory_format=torch.{c.cl_name}"
    return ("edit", c.source), {**c.base, "action": EDIT, "suggestion": fixed, "detail": detail}


def _module_swap_fix(c: _Cause):
    if not any(typ.__name__ == c.module_type for typ in SWAPS):
        return None
    factory = next(f for typ, (_, f) in SWAPS.items() if typ.__name__ == c.module_type)
    name = c.module
    return ("swap", name), {
        **c.base, "action": SWAP,
        "suggestion": f"{module_expr(name)} = {factory}({module_expr(name)})",
        "detail": f"{c.module_type} has no {c.cl_name} kernel on this device: {c.what}; "
                  "the replacement computes the same values in the same format",
    }


def _conv_weight_fix(c: _Cause):
    if not c.view.is_conv[c.e]:
        return None
    return ("conv", c.module), {
        **c.base, "action": WEIGHT,
        "suggestion": f"auditor.fix.convert_conv{c.rank - 2}d_weight_memory_format({module_expr(c.module)}, "
                      f"torch.{c.cl_name})",
        "detail": f"{c.module} computes in {c.frm} and hands its result to a {c.cl_name} convolution; "
                  "run it in the model's format",
    }


def _region_fix(c: _Cause):
    region, added = _region_around(c.view, c.e)
    names = ", ".join(repr(n) for n in region)
    why = ("a reshape that merges C with another dimension must copy a channels_last tensor"
           if c.packet in rules.COPY_OPS else f"{c.module_type or 'this op'} has no {c.cl_name} kernel on this device")
    return ("region", region or (c.module, c.op)), {
        **c.base, "action": REGION, "region": region,
        "suggestion": f"auditor.fix.keep_contiguous(model, [{names}])" if region else "",
        "detail": f"{why}: {c.what}; run the convolutions around it contiguous so no copy is needed "
                  f"(or let auditor.plan_layout measure whether that pays)",
        "added_bytes": added,
    }


#: The fix rules, most specific first; the region rule always answers.
_RULES = (_channel_shuffle_fix, _explicit_copy_fix, _module_swap_fix, _conv_weight_fix, _region_fix)


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


def _is_channel_shuffle(view: analysis.FlowView, c: int, line: str, rank: int) -> bool:
    """A copy of a (N, g, C/g, H, W) transposed view: the classic channel shuffle."""
    rows = view.act_rows.get(c, [])
    return bool(rows) and int(view.tensors["ndim"].to_numpy()[rows[0]]) == rank + 1 and (
        "transpose" in line or "permute" in line)


def _feeds_reshape(view: analysis.FlowView, c: int) -> bool:
    """A copy whose only purpose is a reshape that channels_last cannot view (merging C)."""
    return any(rules.op_packet(view.op[x]) in _RESHAPES for x in view.consumers.get(c, []))


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
    names = sorted({view.module[x] for x in convs if str(view.ops.at[x, "module_type"]).startswith(("Conv", "ConvTranspose"))},
                   key=lambda n: min(x for x in convs if view.module[x] == n))
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
