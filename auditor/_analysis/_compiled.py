"""What a compiled step converts: the tables of a compiled audit, from the rows Inductor's
recorder wrote (:mod:`auditor._recording._inductor`), and the eager audit beside it.

A conversion is a generated kernel that reads an image in one physical order and writes it in
another, as Inductor laid its buffers out (not the FX graph's fake strides, which follow eager
rules), whatever rank or sizes the buffers are declared with. Two tests find one: a read and a
written 4-D or 5-D buffer of the same sizes in different formats, and a load and a store of one
loop of the kernel that cover the same loop variables (element for element) in a different
order of strides (``moves``, read by the recorder from the loop itself: a store into a buffer
typed 2-D, or into a permuted view, is judged by the addresses it writes), unless the two
buffers have the same sizes and strides (each element keeps its address: the loop permutes
values within an axis, as a channel shuffle does, which is the model's computation). Either counts only
for an image: a tensor with as many elements as an activation or gradient a convolution of the
graph reads or writes (:func:`image_numels`), so a kernel that transposes per-position
statistics is none. A kernel that writes a convolution's weight in another order than the
parameter's copies the weight every step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._recording._files import atomic_write
from .._recording._formats import AMBIGUOUS, NOT_APPLICABLE, VIEW_SUFFIX, format_label

CONVERSION_COLUMNS = ["graph", "phase", "kernel", "from_format", "to_format", "bytes", "time_us", "source", "module",
                      "reason", "weight", "buffers", "note"]
#: why a graph has its layout: the rule of Inductor's ``decide_layout_opt`` that decided it, a
#: sentence with its numbers, the numbers, the convolutions that tipped it, what a user can change
DECISION_COLUMNS = ["layout_opt_rule", "layout_opt_reason", "layout_opt_numbers", "layout_opt_tipped",
                    "layout_opt_change"]
GRAPH_COLUMNS = ["graph", "phase", "layout_opt", *DECISION_COLUMNS, "convolutions", "kernels", "conversions",
                 "time_us", "outputs", "output_code"]
COMPARE_COLUMNS = ["cause", "phase", "pattern", "op", "source", "module", "eager_time_us", "status", "kernel",
                   "compiled_time_us", "time_note"]

#: what the two times of a compared row are (the report and the docs say the same)
EAGER_TIME = "eager: the cause's time in causes() (its ops in the eager step, one thread)"
COMPILED_TIME = ("compiled: the whole time of the conversion kernels at its line, summed (a fused kernel's "
                 "computing included), as conversions() lists them one by one")

REMOVED, KEPT, ONLY_COMPILED = "removed by the compiler", "still there", "only compiled"
NOT_SEPARABLE = "the kernel also computes: its whole time and bytes, the conversion's share is not separable"


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(text).split("x")) if str(text) else ()


def _stride(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in str(text).split(",")) if str(text) else ()


def _label(row) -> str:
    return format_label(_shape(row["shape"]), _stride(row["stride"]))


def _definite(label: str) -> bool:
    return not label.startswith(AMBIGUOUS) and label not in (NOT_APPLICABLE, "")


def buffer_formats(buffers: pd.DataFrame) -> pd.DataFrame:
    """``buffers`` with each buffer's ``format`` and ``nbytes``."""
    b = buffers.copy()
    b["format"] = [_label(r) for r in b.to_dict("records")] if len(b) else []
    b["nbytes"] = [int(np.prod(_shape(s), dtype=np.int64)) * int(i) for s, i in zip(b["shape"], b["itemsize"])]
    return b


def conv_roles(kernels: pd.DataFrame, buffers: pd.DataFrame) -> dict[tuple, str]:
    """(graph, phase, buffer) -> "input" or "weight" for the buffers each convolution kernel
    reads in those roles (``convolution_backward`` reads the gradient first)."""
    roles = {}
    for k in kernels[kernels["kind"].eq("extern") & kernels["kernel"].str.contains("convolution")].to_dict("records"):
        reads = buffers[(buffers["graph"] == k["graph"]) & (buffers["phase"] == k["phase"])
                        & (buffers["order"] == k["order"]) & (buffers["role"] == "read")]["buffer"].tolist()
        first = 1 if "backward" in k["kernel"] else 0
        for role, at in (("input", first), ("weight", first + 1)):
            if at < len(reads):
                roles.setdefault((k["graph"], k["phase"], reads[at]), role)
    return roles


def _pairs(reads: list[dict], writes: list[dict]) -> list[tuple[dict, dict]]:
    """(read, written) image pairs of one kernel of the same sizes in different formats."""
    pairs = []
    for w in writes:
        if len(_shape(w["shape"])) not in (4, 5) or not _definite(w["format"]):
            continue
        for r in reads:
            if r["shape"] == w["shape"] and _definite(r["format"]) and \
                    r["format"].removesuffix(VIEW_SUFFIX) != w["format"].removesuffix(VIEW_SUFFIX):
                pairs.append((r, w))
                break
    return pairs


def image_numels(kernels: pd.DataFrame, b: pd.DataFrame) -> dict[tuple, set[int]]:
    """(graph, phase) -> the element counts of its images: the activations and gradients its
    convolutions read and write (not their weights, biases or weight gradients). A graph without
    a convolution counts its 4-D and 5-D buffers with more than one element along every dimension
    but the batch. A tensor with another count (the per-position statistics of a LayerNorm, a
    pooled vector) is no image, whatever order a kernel moves it in."""
    out: dict[tuple, set[int]] = {}
    for key, bs in b.groupby(["graph", "phase"], sort=False):
        ks = kernels[(kernels["graph"] == key[0]) & (kernels["phase"] == key[1])]
        convs = ks[ks["kind"].eq("extern") & ks["kernel"].str.contains("convolution")]
        found: set[int] = set()
        for k in convs.to_dict("records"):
            mine = bs[bs["order"] == k["order"]]
            reads = mine[mine["role"] == "read"]
            at = 1 if "backward" in k["kernel"] else 0
            weight = reads["shape"].iloc[at + 1] if len(reads) > at + 1 else None
            for r in mine.to_dict("records"):
                if len(_shape(r["shape"])) >= 3 and r["shape"] != weight:
                    found.add(int(r["nbytes"] // max(int(r["itemsize"]), 1)))
        if not len(convs):
            for r in bs.to_dict("records"):
                shape = _shape(r["shape"])
                if len(shape) in (4, 5) and min(shape[1:]) > 1:
                    found.add(int(np.prod(shape, dtype=np.int64)))
        out[key] = found
    return out


def _moves(text: str) -> list[tuple[str, str, int]]:
    """The recorder's ``moves`` of a kernel: (read buffer, written buffer, elements)."""
    out = []
    for item in str(text or "").split(";"):
        if ">" in item and ":" in item:
            pair, _, n = item.rpartition(":")
            r, _, w = pair.partition(">")
            out.append((r, w, int(n)))
    return out


def conversions(kernels: pd.DataFrame, buffers: pd.DataFrame, graphs: pd.DataFrame) -> pd.DataFrame:
    """One row per generated kernel that converts an image or copies a weight (module docstring)."""
    if not len(kernels):
        return pd.DataFrame(columns=CONVERSION_COLUMNS)
    b = buffer_formats(buffers)
    roles = conv_roles(kernels, b)
    images = image_numels(kernels, b)
    layout_opt = {(g["graph"], g["phase"]): bool(g["layout_opt"]) for g in graphs.to_dict("records")}
    producers = _producers(kernels, b)
    groups = {key: rows for key, rows in b.groupby(["graph", "phase", "order"], sort=False)}
    rows = []
    for k in kernels[kernels["kind"] != "extern"].to_dict("records"):
        key = (k["graph"], k["phase"])
        mine = groups.get((*key, k["order"]))
        if mine is None:
            continue
        reads, writes = (mine[mine["role"] == r].to_dict("records") for r in ("read", "write"))
        named = {r["buffer"]: r for r in reads + writes}
        pairs = [(r, w) for r, w in _pairs(reads, writes)]
        seen = {(r["buffer"], w["buffer"]) for r, w in pairs}
        for r, w, n in _moves(k.get("moves", "")):
            # a buffer fused away inside the kernel (no argument of its call) lives in registers
            # or a local scratch: the kernel's memory traffic is through its arguments
            if (r, w) in seen or r not in named or w not in named:
                continue
            # the same sizes and strides both sides: each logical element keeps its address, so
            # the loop permutes values within an axis (a channel shuffle), which the model computes
            if named[r]["shape"] == named[w]["shape"] and named[r]["stride"] == named[w]["stride"]:
                continue
            rr, ww = {**named[r], "elements": n}, {**named[w], "elements": n}
            pairs.append((rr, ww))
            seen.add((r, w))
        fed = [roles.get((*key, w["buffer"]), "") for _, w in pairs]
        keep = [(p, role) for p, role in zip(pairs, fed)
                if role or _elements(p[1]) in images.get(key, set()) or _elements(p[0]) in images.get(key, set())]
        if not keep:
            continue
        pairs, fed = [p for p, _ in keep], [role for _, role in keep]
        reasons = [_reason(k, r, w, role, layout_opt.get(key, True), producers)
                   for (r, w), role in zip(pairs, fed)]
        pure = len(pairs) == len(writes) and all(r["buffer"] in {p[0]["buffer"] for p in pairs} for r in reads)
        rows.append({
            "graph": k["graph"], "phase": k["phase"], "kernel": k["kernel"],
            "from_format": "/".join(dict.fromkeys(r["format"] for r, _ in pairs)),
            "to_format": "/".join(dict.fromkeys(w["format"] for _, w in pairs)),
            "bytes": int(mine["nbytes"].sum()), "time_us": k.get("time_us", np.nan),
            "source": k["source"], "module": k["module"], "reason": "; ".join(dict.fromkeys(x for x in reasons if x)),
            "weight": "weight" in fed,
            "buffers": "; ".join(f"{r['buffer']} -> {w['buffer']}" + (f" ({role})" if role else "")
                                 for (r, w), role in zip(pairs, fed)),
            "note": "" if pure else NOT_SEPARABLE})
    return pd.DataFrame(rows, columns=CONVERSION_COLUMNS)


def _elements(row: dict) -> int:
    if "elements" in row:
        return int(row["elements"])
    return int(np.prod(_shape(row["shape"]), dtype=np.int64)) if row.get("shape") else -1


def _producers(kernels: pd.DataFrame, b: pd.DataFrame) -> dict[tuple, str]:
    """(graph, phase, buffer) -> the extern kernel that wrote it, for extern kernels that are no
    convolution (fallbacks and custom ops, whose outputs have fixed strides)."""
    extern = kernels[kernels["kind"].eq("extern") & ~kernels["kernel"].str.contains("convolution")]
    keys = set(zip(extern["graph"], extern["phase"], extern["order"]))
    names = dict(zip(zip(extern["graph"], extern["phase"], extern["order"]), extern["kernel"]))
    writes = b[b["role"] == "write"]
    return {(g, p, buf): names[(g, p, o)] for g, p, o, buf in zip(writes["graph"], writes["phase"], writes["order"],
                                                                 writes["buffer"]) if (g, p, o) in keys}


def _reason(kernel: dict, read: dict, written: dict, role: str, layout_opt: bool, producers: dict) -> str:
    """Why Inductor wrote this conversion, as far as its buffers tell."""
    key = (kernel["graph"], kernel["phase"])
    fixed = producers.get((*key, read["buffer"]))
    why = []
    if fixed:
        why.append(f"{fixed} returns fixed strides ({read['format']})")
    elif read["graph_input"]:
        name = str(read["buffer"])
        why.append(f"the gradient of a graph output arrives {read['format']}" if name.startswith("tangents")
                   else f"graph input in {read['format']}" if name.startswith(("primals", "arg"))
                   else f"saved for backward in {read['format']}")
    if written["graph_output"] and not role:
        why.append(f"graph output kept in eager strides ({written['format']}), e.g. at a graph break")
    if role:
        rank = len(_shape(written["shape"]))
        what = "layout optimization is off" if not layout_opt else \
            "layout optimization covers 2-D convolutions only" if rank == 5 else "the convolution's layout"
        why.append(f"the convolution takes its {role} {written['format']} ({what})")
    return ", ".join(why)


def compiled_graphs(kernels: pd.DataFrame, buffers: pd.DataFrame, graphs: pd.DataFrame,
                    conv: pd.DataFrame) -> pd.DataFrame:
    """Per lowered graph: layout optimization and why, each convolution's input layout, its
    kernels, conversions and time, and the formats of its image outputs (those that cross a
    graph break, and those saved for backward)."""
    b = buffer_formats(buffers)
    rows = []
    for g in graphs.to_dict("records"):
        key = (g["graph"], g["phase"])
        ks = kernels[(kernels["graph"] == key[0]) & (kernels["phase"] == key[1])]
        bs = b[(b["graph"] == key[0]) & (b["phase"] == key[1])]
        convs = []
        for k in ks[ks["kind"].eq("extern") & ks["kernel"].str.contains("convolution")].to_dict("records"):
            reads = bs[(bs["order"] == k["order"]) & (bs["role"] == "read")]["format"].tolist()
            at = 1 if "backward" in k["kernel"] else 0
            convs.append(f"{k['module'] or k['source']}: {reads[at] if at < len(reads) else '?'}")
        outs = bs[bs["graph_output"] & (bs["role"] == "write") & bs["shape"].map(lambda s: len(_shape(s)) in (4, 5))]
        rows.append({**{c: g.get(c, "") for c in ("graph", "phase", "layout_opt", *DECISION_COLUMNS, "output_code")},
                     "convolutions": "; ".join(convs), "kernels": len(ks),
                     "conversions": int(((conv["graph"] == key[0]) & (conv["phase"] == key[1])).sum()),
                     "time_us": ks["time_us"].sum(min_count=1) if "time_us" in ks else np.nan,
                     "outputs": "; ".join(dict.fromkeys(f"{n} {f}" for n, f in zip(outs["buffer"], outs["format"])))})
    return pd.DataFrame(rows, columns=GRAPH_COLUMNS)


def _lines(text: str) -> set[str]:
    return {s for s in str(text).split(";") if s}


def compare_compiled(causes: pd.DataFrame, kernels: pd.DataFrame, conv: pd.DataFrame) -> pd.DataFrame:
    """Each eager cause beside the compiled step: ``still there`` when a compiled conversion of
    the same phase comes from its line (with that kernel), else ``removed by the compiler``; then
    every compiled conversion that no eager cause explains (``only compiled``)."""
    sources = dict(zip(zip(kernels["graph"], kernels["phase"], kernels["kernel"]), kernels["sources"]))
    conv = conv.assign(lines=[_lines(sources.get((g, p, k), s)) | _lines(s) for g, p, k, s in
                              zip(conv["graph"], conv["phase"], conv["kernel"], conv["source"])])
    used, rows, hits = set(), [], []
    for c in causes.to_dict("records"):
        mask = np.array([bool(c["source"]) and c["source"] in ls and p == c["phase"]
                         for ls, p in zip(conv["lines"], conv["phase"])], dtype=bool)
        hit = conv[mask] if len(conv) else conv
        used |= set(hit.index)
        hits.append(set(hit.index))
        rows.append({"cause": c["cause"], "phase": c["phase"], "pattern": c["pattern"], "op": c["op"],
                     "source": c["source"], "module": c["module"], "eager_time_us": c.get("time_us", np.nan),
                     "status": KEPT if len(hit) else REMOVED, "kernel": "; ".join(hit["kernel"]),
                     "compiled_time_us": hit["time_us"].sum(min_count=1) if len(hit) else np.nan})
    for row, mine in zip(rows, hits):
        row["time_note"] = _time_note(row, mine, [(r["cause"], h) for r, h in zip(rows, hits) if h is not mine])
    for _, r in conv.drop(index=list(used)).iterrows():
        rows.append({"cause": np.nan, "phase": r["phase"], "pattern": "", "op": "", "source": r["source"],
                     "module": r["module"], "eager_time_us": np.nan, "status": ONLY_COMPILED, "kernel": r["kernel"],
                     "compiled_time_us": r["time_us"], "time_note": "compiled: the kernel's whole time; no eager cause"})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def _time_note(row: dict, mine: set, others: list) -> str:
    """Why a compared row's two times differ: they are different programs' work (the eager
    ops against the generated kernels), and the kernels' count and sharing."""
    if not mine:
        return "eager only: the compiler writes no conversion at this line"
    parts = [f"{len(mine)} kernel{'s' if len(mine) > 1 else ''} at its line, whole time"]
    shared = sorted({int(c) for c, h in others if h & mine and not pd.isna(c)})
    if shared:
        parts.append(f"shared with cause{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))} "
                     "(counted in each)")
    return "compiled: " + "; ".join(parts)


class CompiledStep:
    """What Inductor lowered for one compiled step (``Audit.compiled``), as recorded: the graphs,
    the kernels with their times, the buffers with their layouts; and the tables drawn from them.
    A finished value, like the Audit that holds it."""

    TABLES = ("graphs", "kernels", "buffers")

    def __init__(self, graphs: pd.DataFrame, kernels: pd.DataFrame, buffers: pd.DataFrame, torch_version: str = ""):
        self._graphs, self._kernels, self._buffers = graphs, kernels, buffers
        self._torch_version = torch_version
        self._conversions: pd.DataFrame | None = None

    @classmethod
    def from_rows(cls, graphs: list[dict], kernels: list[dict], buffers: list[dict], times: dict,
                  torch_version: str = "") -> CompiledStep:
        k = pd.DataFrame(kernels, columns=["graph", "phase", "order", "kernel", "kind", "source", "module", "sources",
                                           "fx_nodes", "moves"])
        k["time_us"] = [times.get(key, np.nan) for key in zip(k["graph"], k["phase"], k["order"])]
        return cls(pd.DataFrame(graphs), k, pd.DataFrame(buffers), torch_version)

    @property
    def torch_version(self) -> str:
        """The torch that compiled the step."""
        return self._torch_version

    def conversions(self) -> pd.DataFrame:
        """One row per kernel that reads an image in one physical order and writes it in another,
        or copies a convolution weight every step (docs, "Compiled models")."""
        if self._conversions is None:
            self._conversions = conversions(self._kernels, self._buffers, self._graphs)
        return self._conversions.copy()

    def graphs(self) -> pd.DataFrame:
        """Per graph Inductor lowered (forward and backward, one per graph break): whether layout
        optimization ran, the rule of ``decide_layout_opt`` that decided it with its numbers, the
        convolutions that tipped it and what to change (docs, "Compiled models"), each
        convolution's layout, kernels, conversions and time."""
        return compiled_graphs(self._kernels, self._buffers, self._graphs, self.conversions())

    def kernels(self) -> pd.DataFrame:
        """Every kernel of the step in code order, with its time and source."""
        return self._kernels.copy()

    def compare(self, causes: pd.DataFrame) -> pd.DataFrame:
        """An eager audit's ``causes()`` beside this step (``auditor.compare_compiled``)."""
        return compare_compiled(causes, self._kernels, self.conversions())

    def to_csv(self, path_or_buf=None) -> str | None:
        """The recorded rows as one CSV (a ``table`` column says which table each row is in),
        from which ``Audit.read_csv(..., compiled=)`` rebuilds every table: written to a path
        (atomically) or a buffer, or returned as text without one."""
        frames = [f.assign(table=name) for name, f in zip(self.TABLES, (self._graphs, self._kernels, self._buffers))]
        head = pd.DataFrame({"table": ["torch"], "output_code": [self._torch_version]})
        text = pd.concat([head, *frames], ignore_index=True).to_csv(index=False)
        if path_or_buf is None:
            return text
        if hasattr(path_or_buf, "write"):
            path_or_buf.write(text)
        else:
            atomic_write(path_or_buf, lambda tmp: tmp.write_text(text))
        return None

    def __repr__(self) -> str:
        return (f"<CompiledStep {len(self._graphs)} graphs, {len(self._kernels)} kernels, "
                f"{len(self.conversions())} conversions>")

    @classmethod
    def read_csv(cls, path_or_buf) -> CompiledStep:
        """Inverse of :meth:`to_csv`."""
        import io

        if isinstance(path_or_buf, str) and "\n" in path_or_buf:
            path_or_buf = io.StringIO(path_or_buf)
        whole = pd.read_csv(path_or_buf, keep_default_na=False, na_values={"time_us": [""]})
        if "table" not in whole or set(whole["table"]) - {"torch", *cls.TABLES}:
            raise ValueError("not a compiled step's CSV (written by Audit.compiled.to_csv)")
        parts = {}
        for name, cols in (("graphs", ["graph", "phase", "compile_id", "layout_opt", *DECISION_COLUMNS,
                                       "layout_opt_log", "output_code"]),
                           ("kernels", ["graph", "phase", "order", "kernel", "kind", "source", "module", "sources",
                                        "fx_nodes", "moves", "time_us"]),
                           ("buffers", ["graph", "phase", "order", "role", "buffer", "shape", "stride", "dtype",
                                        "itemsize", "graph_input", "graph_output"])):
            part = whole[whole["table"] == name].reindex(columns=cols, fill_value="").reset_index(drop=True)
            parts[name] = _typed(part)
        version = whole.loc[whole["table"] == "torch", "output_code"]
        return cls(parts["graphs"], parts["kernels"], parts["buffers"], str(version.iloc[0]) if len(version) else "")


_INTS, _BOOLS = ("graph", "order", "itemsize"), ("layout_opt", "graph_input", "graph_output")


def _typed(part: pd.DataFrame) -> pd.DataFrame:
    for c in part.columns:
        if c in _INTS:
            part[c] = pd.to_numeric(part[c]).astype(np.int64)
        elif c in _BOOLS:
            part[c] = part[c].map({"True": True, "False": False, True: True, False: False}).astype(bool)
        elif c == "time_us":
            part[c] = pd.to_numeric(part[c], errors="coerce").astype(np.float64)
        else:
            part[c] = part[c].astype(str)
    return part


def compiled_report_tables(step: CompiledStep, causes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(graphs, conversions, eager causes beside them): what the report and the HTML show."""
    return step.graphs(), step.conversions(), step.compare(causes)
