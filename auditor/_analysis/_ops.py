"""Hotspots: the losses and conversions on conv -> ... -> conv paths, per op and grouped.

:func:`classified_ops` joins the classification and the data flow into one row per event, the
table the causes are traced over (:mod:`._pipeline` adds them and the final hotspot mask);
:func:`hotspots` groups the hotspot rows of the final table.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import torch

from .._recording import _rules as rules
from .._recording._formats import AMBIGUOUS, VIEW_SUFFIX, base_format, format_label
from .._recording._torch import is_reduction
from ._activations import floating_rows, image_facts, op_flags, parse_tuple
from ._classification import classify
from ._flow import FlowGraph, follow_links, reachable

HOTSPOT_KEYS = ["phase", "module", "op", "source", "kind"]


def op_times(ops: pd.DataFrame) -> np.ndarray:
    """Per op, its kernel time (the profiler's, else the wall time around it; NaN when untimed)."""
    for col in ("time_us", "duration_us"):
        if col in ops and ops[col].notna().any():
            return ops[col].to_numpy(dtype=np.float64)
    return np.full(len(ops), np.nan)


def classified_ops(events: pd.DataFrame, tensors: pd.DataFrame, graph: FlowGraph | None = None,
                   facts: pd.DataFrame | None = None) -> pd.DataFrame:
    """``events`` plus the classification and data-flow columns the causes are traced over.

    Added columns: ``kind``, ``bytes``, ``from_format``, ``to_format``, ``is_conv``,
    ``cl_input``, ``after_conv`` (a convolution feeds it, in its phase), ``before_conv`` (it
    feeds a convolution, in its phase), ``weight_permuted`` (a convolution that permutes its
    weight), ``layout_independent`` (a copy that would happen in any layout, or a conversion
    whose every operand and result has a layout the model's code pins, :func:`_pinned_conversions`),
    ``uncertain`` (the assumptions such a conversion's verdict rests on; "" for others) and
    ``hotspot``.

    A loss or conversion is a hotspot when it lies on a conv -> ... -> conv path. A conversion
    inside a convolution is one when the operand it permutes came from such a path (from a
    convolution or an op after one; in backward that operand may be an activation saved in
    forward, so its producer is looked up across phases), when it permutes its weight (every
    step), and a convolution that loses channels_last is one when it reads from or writes to
    such a path. A layout-independent copy or conversion is never one. This ``hotspot`` is a candidate: the
    final mask keeps those that have a cause (:class:`~._pipeline.Analysis`). ``graph`` and ``facts`` are the
    audit's :class:`FlowGraph` and :func:`~.activations.image_facts`, built here when not given.
    """
    facts = facts if facts is not None else image_facts(events, tensors)
    cls = classify(events, tensors, facts)
    graph = graph or FlowGraph(events, tensors)
    conv = cls["is_conv"].to_numpy()
    after = graph.downstream_of(conv)
    before = graph.upstream_of(conv)
    kind = cls["kind"].to_numpy()
    costly = np.isin(kind, rules.COSTLY_KINDS)
    independent, copied_bytes = _layout_independent_copies(events, tensors, facts, kind)
    weight = _weight_permuted(tensors, cls)
    hot = costly & after & before & ~conv & ~independent
    hot |= _conv_hotspots(tensors, graph, cls, after, before) | weight
    moved = cls["bytes"].to_numpy().copy()
    moved[independent] = copied_bytes[independent]
    pinned, uncertain = _pinned_conversions(events, tensors, facts, hot, weight)
    out = pd.concat([events, cls.assign(bytes=moved)], axis=1)
    out["after_conv"] = after
    out["before_conv"] = before
    out["weight_permuted"] = weight
    out["layout_independent"] = independent | pinned
    out["uncertain"] = uncertain
    out["hotspot"] = hot & ~pinned
    return out


def _conv_hotspots(tensors, graph: FlowGraph, cls: pd.DataFrame, after, before) -> np.ndarray:
    """Convolutions that permute an operand that came from a conv path, or that lose
    channels_last on such a path."""
    conv = cls["is_conv"].to_numpy()
    kind = cls["kind"].to_numpy()
    hot = np.zeros(len(conv), dtype=bool)
    conv_conv = np.flatnonzero(np.isin(kind, rules.COSTLY_KINDS) & conv)
    if not conv_conv.size:
        return hot
    links = graph.links
    cand = links[np.isin(links["consumer"].to_numpy(), conv_conv)]
    fmt = tensors["format"].to_numpy()[cand["row"].to_numpy()]
    base = np.array([base_format(f) for f in fmt], dtype=object)
    target = cls["to_format"].to_numpy()[cand["consumer"].to_numpy()]
    permuted = (base != target) & np.isin(base, ["contiguous", "channels_last", "channels_last_3d", "other"])
    p = cand["producer"].to_numpy()
    fed = permuted & (after[p] | conv[p])
    hot[np.unique(cand["consumer"].to_numpy()[fed])] = True
    loses = conv_conv[kind[conv_conv] == rules.LOSES]
    hot[loses[after[loses] | before[loses]]] = True
    return hot


def _weight_permuted(tensors: pd.DataFrame, cls: pd.DataFrame) -> np.ndarray:
    """Convolutions whose weight is stored in another definite format than they compute in:
    they permute it on every call."""
    n = len(cls)
    out = np.zeros(n, dtype=bool)
    if not n:
        return out
    is_conv = cls["is_conv"].to_numpy()
    w = tensors[(tensors["arg"] == "weight").to_numpy() & (tensors["role"] == "input").to_numpy()
                & is_conv[tensors["seq"].to_numpy()]]
    fmt = np.array([base_format(str(f)) for f in w["format"].to_numpy()], dtype=object)
    made = cls["to_format"].astype(str).to_numpy()[w["seq"].to_numpy()]
    definite = ("contiguous", "channels_last", "channels_last_3d")
    differs = np.isin(fmt, definite) & np.isin(made, definite) & (fmt != made)
    out[w["seq"].to_numpy()[differs]] = True
    return out & (cls["kind"].to_numpy() == rules.CONVERTS)


def _layout_independent_copies(events, tensors, facts, kind) -> tuple[np.ndarray, np.ndarray]:
    """Copies that would happen in any layout, and the bytes they copy: a copy of a 4-D/5-D
    tensor that is not an image (attention heads, tokens), or a copy that materialises an image
    view in no dense standard layout (a slice, a transposed channel shuffle) and keeps its
    format family. A copy into another family is a format cost, not one of these."""
    n = len(events)
    independent = np.zeros(n, dtype=bool)
    nbytes = np.zeros(n, dtype=np.int64)
    if not n or not len(tensors):
        return independent, nbytes
    copy_op = op_flags(events["op"], rules.is_copy)
    seq = tensors["seq"].to_numpy()
    arg = tensors["arg"].astype(str).to_numpy()
    is_in = (tensors["role"] == "input").to_numpy()
    # the copied tensor: copy_'s src, else the first argument
    has_src = np.zeros(n, dtype=bool)
    has_src[seq[is_in & (arg == "src")]] = True
    source = is_in & ((arg == "src") | ((tensors["position"].to_numpy() == 0) & ~has_src[seq]))
    rows = np.flatnonzero(source & copy_op[seq] & floating_rows(tensors) & (tensors["ndim"].to_numpy() >= 4))
    label, image, size = facts["label"].to_numpy(), facts["image"].to_numpy(), tensors["bytes"].to_numpy()
    for r in rows:
        e = int(seq[r])
        if kind[e] == rules.VIEW:
            continue
        odd = str(label[r]).endswith(VIEW_SUFFIX) or base_format(str(label[r])) == "other"
        independent[e] = not image[r] or (odd and kind[e] in (rules.PRESERVES, rules.AMBIGUOUS_KIND))
        nbytes[e] = int(size[r])
    return independent, nbytes


# -- layout provenance --------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _policy(op: str, requested: str) -> str:
    """:func:`auditor._recording._rules.layout_policy`, and where it knows none, what torch's
    tags say: a pointwise op or a reduction is a TensorIterator kernel."""
    policy = rules.layout_policy(op, requested)
    if policy != rules.LAYOUT_UNKNOWN:
        return policy
    namespace, _, rest = op.partition(".")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        func = getattr(packet, overload or "default")
        tags = func.tags
    except (AttributeError, RuntimeError):
        return policy
    return rules.LAYOUT_ITERATOR if torch.Tag.pointwise in tags or is_reduction(func) else policy


def _channels_last_like(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Dimension 1 is the innermost of the dimensions of size > 1 (what makes torch's
    ``suggest_memory_format`` say channels_last); an N×1×H×W or N×C×1×1 tensor has no order to
    follow."""
    if len(shape) < 4 or len(strides) != len(shape) or shape[1] == 1 or all(s == 1 for s in shape[2:]):
        return False
    dims = [d for d in range(len(shape)) if shape[d] > 1]
    return min(dims, key=lambda d: (strides[d], -d)) == 1


_POLICIES = (rules.LAYOUT_UNKNOWN, rules.LAYOUT_OWN, rules.LAYOUT_SUGGESTED, rules.LAYOUT_CONVOLUTION,
             rules.LAYOUT_FOLLOWS, rules.LAYOUT_STRIDED, rules.LAYOUT_ITERATOR)
_UNKNOWN, _OWN, _SUGGESTED, _CONVOLUTION, _FOLLOWS, _STRIDED, _ITERATOR = range(len(_POLICIES))
#: the requested memory formats that choose channels_last, the format an audit is about
_CHANNELS_LAST_FORMATS = ("channels_last", "channels_last_3d")
_MAIN_ARGS = ("self", "input", "grad_output", "src")


def _category_in(column: pd.Series, names) -> np.ndarray:
    """Per row of a categorical column, whether its value is one of ``names``."""
    hit = np.append(np.isin(column.cat.categories.astype(str), list(names)), False)
    return hit[column.cat.codes.to_numpy()]


def _first_row(groups: np.ndarray, mask: np.ndarray, size: int) -> np.ndarray:
    """Per group (0..size-1), the first row where ``mask`` holds; -1 where none does."""
    first = np.full(size, -1, dtype=np.int64)
    rows = np.flatnonzero(mask)
    first[groups[rows][::-1]] = rows[::-1]
    return first


def _pairs(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(which range, row) for every row of the ranges [start, start + count)."""
    total = int(counts.sum())
    which = np.repeat(np.arange(len(starts)), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return which, np.repeat(starts, counts) + offsets


def layout_provenance(events: pd.DataFrame, tensors: pd.DataFrame, facts: pd.DataFrame
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor row: whether its layout is *pinned* (the same whatever memory format the model
    and its input are in: the model's code fixes it) rather than following the model's format,
    and the assumption a pinned verdict rests on ("" when none).

    A tensor keeps the layout it was made with: views and in-place results have their base's
    provenance, so provenance belongs to the tensor that owns the memory, decided by the op that
    made it, from the ops' layout policies (:func:`auditor._recording._rules.layout_policy`):

    * a source (nothing recorded made it: the model's input, parameters, buffers) of rank 4 or 5
      follows the format (``Module.to(memory_format=...)`` converts those) unless ambiguous
      (N×C×1×1: one physical order in both formats); any other is pinned;
    * a copy the code asks for in channels_last (``.to(memory_format=...)``) of a tensor nothing
      computed (a factory's result, a source) follows the format: converting the input and the
      weights in code is how the format under audit is chosen;
    * a result of rank 0 or 1, and one of an op that writes its own order, is pinned;
    * a convolution's result is pinned when its input is pinned and channels_last-like (it
      computes channels_last then, whatever its weight is); its weight gradients are laid out
      as the weight;
    * a ``suggest_memory_format`` op's result is pinned when it reads an NHWC view of an image
      (its dimension 1 is not the channels: innermost in neither layout), else when every
      tensor it reads but a parameter is pinned;
    * any other result is pinned when every tensor its op reads is. For an op of no known policy
      that is an assumption (it follows its inputs), and strides given as arguments
      (``empty_strided``, ``as_strided``: autograd copies them from a tensor the log does not
      name) are assumed pinned unless channels_last-like: a pinned verdict downstream says so.

    Dependence is reachability from the tensors that follow the format, over the reads that
    decide a layout, so the cost is a few passes over the rows, whatever the log's length.
    """
    n_rows = len(tensors)
    pinned = np.ones(n_rows, dtype=bool)
    why = np.full(n_rows, "", dtype=object)
    if not n_rows:
        return pinned, why
    n = len(events)
    seq = tensors["seq"].to_numpy().astype(np.int64)
    tid = tensors["tid"].to_numpy().astype(np.int64)
    is_out = (tensors["role"] == "output").to_numpy()
    is_view = tensors["is_view"].to_numpy()
    is_param = tensors["is_param"].to_numpy()
    ndim = tensors["ndim"].to_numpy()
    position = tensors["position"].to_numpy()
    bounds = np.searchsorted(seq, np.arange(n + 1))

    def arg_in(*names: str) -> np.ndarray:  # per row, its argument is one of ``names``
        return _category_in(tensors["arg"], names)

    # each event's policy, once per distinct (op, requested format)
    ops = [str(o) for o in events["op"].cat.categories]
    op_code = events["op"].cat.codes.to_numpy().astype(np.int64)
    if "requested_format" in events:
        req = [str(r) for r in events["requested_format"].cat.categories] + [""]
        req_code = events["requested_format"].cat.codes.to_numpy().astype(np.int64)
    else:
        req, req_code = [""], np.full(n, -1, dtype=np.int64)
    pair, pair_code = np.unique(op_code * (len(req) + 1) + (req_code + 1), return_inverse=True)
    table = np.array([_POLICIES.index(_policy(ops[p // (len(req) + 1)], req[p % (len(req) + 1) - 1]))
                      for p in pair], dtype=np.int8)
    policy = table[pair_code.reshape(-1)][seq]  # per row, its op's

    # channels_last-like and ambiguous layouts, decided once per distinct layout, where asked
    shape_code = tensors["shape"].cat.codes.to_numpy().astype(np.int64)
    strides_code = tensors["strides"].cat.codes.to_numpy().astype(np.int64)
    shapes, strides = tensors["shape"].cat.categories, tensors["strides"].cat.categories

    def layouts(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(channels_last-like, ambiguous, of a definite format) per row"""
        codes, uniq = pd.factorize(shape_code[rows] * (len(strides) + 1) + strides_code[rows])
        cl, amb, sure = (np.zeros(len(uniq), dtype=bool) for _ in range(3))
        for i, code in enumerate(uniq.tolist()):
            sh = parse_tuple(str(shapes[code // (len(strides) + 1)]))
            st = parse_tuple(str(strides[code % (len(strides) + 1)]))
            label = format_label(sh, st)
            cl[i], amb[i], sure[i] = _channels_last_like(sh, st), label == AMBIGUOUS, bool(rules.definite(label))
        return cl[codes], amb[codes], sure[codes]

    # who owns each tensor's memory: views (but strides given as arguments) lead to their base
    n_tid = int(tid.max()) + 1
    outs = np.flatnonzero(is_out)
    which, read = _pairs(bounds[seq[outs]], bounds[seq[outs] + 1] - bounds[seq[outs]])
    same = ~is_out[read] & (tid[read] == tid[outs[which]])
    inplace = np.zeros(n_rows, dtype=bool)
    inplace[outs[which[same]]] = True
    strided = is_out & (policy == _STRIDED) & (ndim >= 4)
    follows_base = is_out & is_view & ~strided & ~inplace
    first_in = _first_row(seq, ~is_out, n)
    views = np.flatnonzero(follows_base)
    base = first_in[seq[views]]
    ok = base >= 0
    root = follow_links(n_tid, tid[views[ok]], tid[base[ok]])
    node = root[tid]  # per row, the tensor whose provenance it has
    makes = is_out & ~inplace & ~follows_base

    # the tensors that follow the format outright
    seeds = np.zeros(n_tid, dtype=bool)
    made = np.zeros(n_tid, dtype=bool)
    made[tid[makes]] = True
    first_seen = _first_row(tid, np.ones(n_rows, dtype=bool), n_tid)
    first_seen = first_seen[first_seen >= 0]
    sources = first_seen[~made[tid[first_seen]] & (root[tid[first_seen]] == tid[first_seen])]
    sources = sources[(ndim[sources] == 4) | (ndim[sources] == 5)]
    seeds[tid[sources[~layouts(sources)[1]]]] = True
    conv_input = _first_row(seq, ~is_out & arg_in("input"), n)
    main = np.flatnonzero(makes & (policy == _CONVOLUTION) & (position == 0) & (ndim >= 2))
    x = conv_input[seq[main]]
    seeds[tid[main[x < 0]]] = True
    seeds[tid[main[x >= 0][~layouts(x[x >= 0])[0]]]] = True
    strided_made = np.flatnonzero(strided & makes)
    cl, amb, _ = layouts(strided_made)
    seeds[tid[strided_made[cl & ~amb]]] = True
    # a channels_last copy the code makes of a tensor nothing computed (a factory's, or a
    # source) chooses the format under audit, as Module.to(memory_format=...) does for the
    # sources when the model and its input are made inside the recording: it follows the format
    if "requested_format" in events:
        asks = events["requested_format"].isin(_CHANNELS_LAST_FORMATS).to_numpy()
        copies = np.flatnonzero(makes & asks[seq] & (ndim >= 4))
        copied = first_in[seq[copies]]
        copies, copied = copies[copied >= 0], copied[copied >= 0]
        factory_made = np.zeros(n_tid, dtype=bool)
        by_factory = np.array([rules.is_factory(o) for o in ops], dtype=bool)[op_code]
        factory_made[tid[makes & by_factory[seq]]] = True
        uncomputed = factory_made[node[copied]] | ~made[node[copied]]
        seeds[tid[copies[uncomputed]]] = True
    guessed = np.zeros(n_rows, dtype=bool)
    guessed[strided_made[~cl & ~amb]] = True
    strided_ambiguous = np.zeros(n_rows, dtype=bool)
    strided_ambiguous[strided_made[amb]] = True

    # the reads that decide a layout: (reader row, made row)
    # suggest_memory_format says contiguous for fewer than 4 dimensions: such a op writes its own order
    decides = makes & (ndim >= 2) & (policy != _OWN) & ~((policy == _SUGGESTED) & (ndim < 4)) & ~strided_ambiguous
    suggested = _first_row(seq, ~is_out & ~is_param & arg_in(*_MAIN_ARGS), n)
    fallback = _first_row(seq, ~is_out & ~is_param, n)
    suggested = np.where(suggested >= 0, suggested, fallback)
    image, cdim = facts["image"].to_numpy(), facts["cdim"].to_numpy()
    nhwc = (suggested >= 0) & image[np.maximum(suggested, 0)] & (cdim[np.maximum(suggested, 0)] != 1)
    decides &= ~((policy == _SUGGESTED) & nhwc[seq])
    out_rows = np.flatnonzero(decides)
    e = seq[out_rows]
    which, read = _pairs(bounds[e], bounds[e + 1] - bounds[e])
    made_row = out_rows[which]
    p = policy[made_row]
    conv_out = position[made_row] >= 1
    keep = ~is_out[read] & np.select(
        [p == _SUGGESTED, (p == _CONVOLUTION) & ~conv_out, (p == _CONVOLUTION) & conv_out],
        [~is_param[read], arg_in("input")[read], arg_in("weight")[read]], default=True)
    keep &= _before_the_decider(p == _ITERATOR, read, made_row, is_out, shape_code, layouts)
    frm, to = node[read[keep]], tid[made_row[keep]]

    dependent = seeds | reachable(n_tid, seeds, frm, to)
    pinned = ~dependent[node]

    # assumptions: an op of no known policy, strides given as arguments, and what follows them
    assumed = makes & (policy == _UNKNOWN) & (ndim >= 2)
    reasons: dict[str, list[np.ndarray]] = {}
    for rows, text in ((assumed, "layout policy of {} assumed to follow its inputs"),
                       (guessed, "strides of {} given as arguments, assumed not to follow the model's format")):
        code = op_code[seq[rows]]
        for c in np.unique(code).tolist():
            reasons.setdefault(text.format(rules.op_packet(ops[c])), []).append(tid[rows][code == c])
    if reasons:
        live = ~dependent[frm] & ~dependent[to]
        for text, tids in reasons.items():
            start = np.zeros(n_tid, dtype=bool)
            start[np.concatenate(tids)] = True
            start &= ~dependent
            if not start.any():
                continue
            hit = (start | reachable(n_tid, start, frm[live], to[live]))[node]
            why[hit] = [f"{w}; {text}" if w else text for w in why[hit]]
    return pinned, why


def _before_the_decider(iterator: np.ndarray, read: np.ndarray, made_row: np.ndarray, is_out: np.ndarray,
                        shape_code: np.ndarray, layouts) -> np.ndarray:
    """Per (read, made) pair: whether the read can decide the made tensor's layout. A
    TensorIterator kernel orders its result's dimensions as the first operand that tells them
    apart: once an operand of the result's shape and a definite format has been read, the
    operands after it decide nothing (a residual added to attention output written channels_last
    in any layout stays channels_last in any layout). Every read of any other op counts."""
    keep = np.ones(len(read), dtype=bool)
    rows = np.flatnonzero(iterator & ~is_out[read] & (shape_code[read] == shape_code[made_row]))
    if not len(rows):
        return keep
    rows = rows[layouts(read[rows])[2]]
    decider = np.full(int(made_row.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(decider, made_row[rows], read[rows])
    return keep & ~(iterator & (read > decider[made_row]))


def _pinned_conversions(events: pd.DataFrame, tensors: pd.DataFrame, facts: pd.DataFrame, hot: np.ndarray,
                        weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per event, a hotspot candidate whose every activation operand and result has a pinned
    layout (:func:`layout_provenance`): the same conversion, with the same strides, happens
    whatever memory format the model is in, so it is a layout-independent conversion, not a
    hotspot; per event, the assumptions such a verdict rests on, "" where none).

    The activations are the floating 4-D/5-D tensors it reads and writes, weights and their
    gradients aside, except a weight the convolution permutes."""
    n = len(events)
    pinned = np.zeros(n, dtype=bool)
    uncertain = np.full(n, "", dtype=object)
    if not hot.any() or not len(tensors):
        return pinned, uncertain
    layout_pinned, why = layout_provenance(events, tensors, facts)
    seq = tensors["seq"].to_numpy()
    is_out = (tensors["role"] == "output").to_numpy()
    conv = op_flags(events["op"], rules.is_convolution)
    weights = (_category_in(tensors["arg"], rules.WEIGHT_ARGS) | tensors["is_param"].to_numpy()) & ~is_out
    permuted = weights & weight[seq] & _category_in(tensors["arg"], ("weight",))
    rows = (hot[seq] & floating_rows(tensors) & (tensors["ndim"].to_numpy() >= 4)
            & ~(is_out & conv[seq] & (tensors["position"].to_numpy() >= 1)) & (~weights | permuted))
    counted = np.bincount(seq[rows], minlength=n)
    following = np.bincount(seq[rows & ~layout_pinned], minlength=n)
    pinned = hot & (counted > 0) & (following == 0)
    assumed = rows & (why != "") & pinned[seq]
    for r in np.flatnonzero(assumed).tolist():  # the assumptions each verdict rests on, in order
        parts = [*uncertain[seq[r]].split("; "), *why[r].split("; ")] if uncertain[seq[r]] else why[r].split("; ")
        uncertain[seq[r]] = "; ".join(dict.fromkeys(parts))
    return pinned, uncertain


HOTSPOT_COLUMNS = [
    "phase", "module", "module_type", "op", "kind", "from_format", "to_format",
    "count", "bytes", "share", "source", "first_seq", "cause", "time_us",
]


def hotspots(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per hotspot group (phase, module, op, source, kind, and cause when the ops
    table has causes): ``time_us`` is the groups' kernel time (the profiler's, else the wall
    time around each op, NaN when untimed), largest first when timed, else largest ``bytes``
    first."""
    hot = ops[ops["hotspot"]]
    if "cause" not in ops:
        hot = hot.assign(cause=0)
    times = op_times(ops)
    timed = not np.isnan(times).all()
    hot = hot.assign(_time=times[ops["hotspot"].to_numpy()])
    agg = {
        "module_type": ("module_type", "first"),
        "from_format": ("from_format", "first"),
        "to_format": ("to_format", "first"),
        "count": ("seq", "size"),
        "bytes": ("bytes", "sum"),
        "first_seq": ("seq", "min"),
        "time_us": ("_time", lambda t: t.sum(min_count=1)),
    }
    if hot.empty:
        numeric = {"count": "int64", "bytes": "int64", "share": "float64", "first_seq": "int64", "time_us": "float64",
                   "cause": "int64"}
        return pd.DataFrame({c: pd.Series(dtype=numeric.get(c, "object")) for c in HOTSPOT_COLUMNS})
    g = hot.groupby([*HOTSPOT_KEYS, "cause"], observed=True, sort=False).agg(**agg).reset_index()
    total = g["bytes"].sum()
    g["share"] = g["bytes"] / total if total else 0.0
    by = ["time_us", "bytes"] if timed else ["bytes"]
    g = g.sort_values([*by, "first_seq"], ascending=[False] * len(by) + [True], ignore_index=True)
    for c in ("phase", "module", "module_type", "op", "kind", "from_format", "to_format", "source"):
        g[c] = g[c].astype(str)
    return g[HOTSPOT_COLUMNS]
