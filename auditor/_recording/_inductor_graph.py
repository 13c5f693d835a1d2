"""One lowered Inductor graph as rows: its kernels, the buffers each reads and writes with the
layouts Inductor chose, and why layout optimization ran or not. Called by
:class:`._inductor.InductorRecorder` right after the graph was scheduled and written out."""

from __future__ import annotations

import torch

from . import _torch as T

#: Where a hint for a symbolic size is missing (dynamic shapes without an example value).
_NO_HINT = 8192


def _hint(graph, e) -> int:
    try:
        return int(e)
    except TypeError:
        return int(graph.sizevars.optimization_hint(e, fallback=_NO_HINT))


def layout_of(graph, node):
    """(shape, stride, dtype) Inductor gave ``node``, as ints (hints for symbolic sizes), or None
    for a node without one (a multi-output parent, a mutation, an opaque layout)."""
    ir = T.inductor_ir
    try:
        lay = node.get_layout()
    except Exception:  # noqa: BLE001  (MultiOutputLayout raises NotImplementedError; others vary)
        return None
    if not isinstance(lay, ir.Layout) or isinstance(lay, (ir.MultiOutputLayout, ir.NoneLayout)):
        return None
    return (tuple(_hint(graph, s) for s in lay.size), tuple(_hint(graph, s) for s in lay.stride), lay.dtype)


def user_frame(node) -> tuple[str, str]:
    """(``file:line``, module path) of an FX node: the last frame of its ``stack_trace``, which is
    the user's line (AOTAutograd copies it onto backward nodes), and its ``nn_module_stack``."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    source = ""
    for line in reversed(trace):
        line = line.strip()
        if line.startswith("File ") and ", line " in line:
            path = line.split('"')[1] if '"' in line else "?"
            source = f"{path}:{line.split(', line ')[1].split(',')[0]}"
            break
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    module = ""
    if stack:
        path, _type = list(stack.values())[-1]
        module = _module_path(path)
    return source, module


def _module_path(dynamo_path: str) -> str:
    """``L['self'].layer1[0].conv1`` (Dynamo's spelling) as ``layer1.0.conv1``."""
    text = str(dynamo_path)
    if text.startswith("L["):
        text = text.split("]", 1)[1] if "]" in text else ""
    text = text.replace("][", ".").replace("[", ".").replace("]", "").replace("'", "")
    for prefix in ("._modules.", "._orig_mod."):
        text = text.replace(prefix, ".")
    return text.strip(".")


def origins(nodes) -> list:
    """The FX nodes IR nodes came from, by name, once each."""
    seen = {}
    for node in nodes:
        for fx in sorted(getattr(node, "origins", ()) or (), key=lambda n: n.name):
            seen.setdefault(fx.name, fx)
    return list(seen.values())


def where_from(fx_nodes) -> tuple[str, str, str]:
    """(source, module, every source) of a kernel's FX nodes: the first node with a line; a
    kernel whose nodes have none (a graph input's copy, a stride constraint) borrows the line of
    a neighbouring node, its consumer first."""
    frames = [user_frame(n) for n in fx_nodes]
    lines = [f for f in frames if f[0]]
    if not lines:
        for n in fx_nodes:
            for near in [*n.users, *n.all_input_nodes]:
                frame = user_frame(near)
                if frame[0]:
                    return frame[0], frame[1], frame[0]
        return "", next((m for _, m in frames if m), ""), ""
    module = next((m for s, m in lines if m), "")
    return lines[0][0], module, ";".join(dict.fromkeys(s for s, _ in lines))


#: the columns of a graph row that say why its layout is what it is
DECISION_COLUMNS = ("layout_opt_rule", "layout_opt_reason", "layout_opt_numbers", "layout_opt_tipped",
                    "layout_opt_change")

#: what a user can change, per rule of ``decide_layout_opt``
_CHANGE = {
    "config off": "torch._inductor.config.layout_optimization = True (TORCHINDUCTOR_LAYOUT_OPTIMIZATION=1)",
    "forced": "torch._inductor.config.force_layout_optimization = False (TORCHINDUCTOR_FORCE_LAYOUT_OPT=0)",
    "no convolution": "nothing: the rules weigh convolutions only",
    "device rule": "to turn it off: torch._inductor.config.layout_optimization = False",
    "few convolutions": "torch._inductor.config.force_layout_optimization = True, or a graph break that puts the "
                        "convolutions in a graph of their own",
    "dynamic shapes": "compile with dynamic=False (or mark the sizes static), or "
                      "torch._inductor.config.force_layout_optimization = True",
    "grouped": "the convolutions named: groups=1 or depthwise (one input channel per group), or "
               "torch._inductor.config.force_layout_optimization = True",
    "in/out channels": "the convolutions named: a kernel of 1 where they shrink the channels, or "
                       "torch._inductor.config.force_layout_optimization = True",
    "small channels": "a convolution with more than the threshold's channels, or "
                      "torch._inductor.config.force_layout_optimization = True",
    "inference FLOPs": "the grouped convolutions named (their weight tips the estimate), or "
                       "torch._inductor.config.force_layout_optimization = True",
    "training rules passed": "to turn it off: torch._inductor.config.layout_optimization = False",
    "inference FLOPs passed": "to turn it off: torch._inductor.config.layout_optimization = False",
}


def _conv_name(node) -> str:
    source, module = user_frame(node)
    return module or source or node.name


def _is_conv_backward(node) -> bool:
    return node.target is torch.ops.aten.convolution_backward.default


def _weight(node):
    """The weight's fake value of a convolution node: argument 1, or 2 for convolution_backward
    (which reads the output gradient first)."""
    at = 2 if _is_conv_backward(node) else 1
    val = node.args[at].meta.get("val") if len(node.args) > at and hasattr(node.args[at], "meta") else None
    return val if isinstance(val, torch.Tensor) else None


def _groups(node):
    return node.args[9] if _is_conv_backward(node) and len(node.args) > 9 else node.args[-1]


def _rules_with_convolutions(c: dict, convs: list, nodes: list, numbers: dict, flops: dict, kinds: dict,
                             is_inference: bool, verdict, arg_val, grouped, in_out, small) -> dict:
    """The rules ``decide_layout_opt`` applies to a graph with convolutions, in its order: the
    device, how many nodes per convolution, dynamic shapes, then the inference FLOPs or the
    training rules; the first that decides, as a verdict."""
    total = sum(flops.values())
    devices = {getattr(arg_val(n, i), "device", None) for n in convs for i in (0, 1)}
    device_types = sorted({d.type for d in devices if d is not None})
    mkldnn = torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()
    numbers["devices"] = "/".join(device_types)
    numbers["oneDNN"] = "enabled" if mkldnn else ("disabled" if torch.backends.mkldnn.is_available()
                                                  else "not built")
    if mkldnn and None not in devices and all(t in T.SUPPORTED_MKLDNN_DEVICES for t in device_types):
        v = verdict("device rule", True, f"oneDNN is enabled and every convolution runs on "
                    f"{'/'.join(device_types)} ({'/'.join(T.SUPPORTED_MKLDNN_DEVICES)} always take "
                    "channels_last), before any other rule", convs)
    elif len(nodes) >= c["nodes_per_conv"] * len(convs):
        v = verdict("few convolutions", False, f"{len(convs)} convolutions among {len(nodes)} nodes: "
                    f"{len(nodes) / len(convs):.0f} nodes per convolution, at least "
                    f"{c['nodes_per_conv']}", convs)
    elif any(T.has_free_symbols(arg_val(n, i)) for n in convs for i in (0, 1)
             if isinstance(arg_val(n, i), torch.Tensor)):
        v = verdict("dynamic shapes", False, "dynamic shapes: a convolution's input or weight has symbolic sizes",
                    [n for n in convs if any(isinstance(arg_val(n, i), torch.Tensor)
                                             and T.has_free_symbols(arg_val(n, i)) for i in (0, 1))])
    elif is_inference:
        m = c["multipliers"]
        weighted = sum(flops.get(k, 0.0) * m[k] for k in m)
        numbers["weighted FLOPs / FLOPs"] = f"{weighted / total:.3f}" if total else "no FLOPs counted"
        on = weighted <= total
        heavy = [n for n in convs if m[kinds[n]] > 1]
        v = verdict("inference FLOPs passed" if on else "inference FLOPs", on,
                    f"inference: the convolutions' FLOPs weighted by Inductor's measured channels_last "
                    f"speed-ups ({', '.join(f'{k} {x}' for k, x in m.items())}) come to "
                    f"{weighted / total if total else 0:.3f} of the FLOPs, {'at most' if on else 'more than'} 1",
                    heavy if not on else convs)
    elif any(map(grouped, convs)):
        v = verdict("grouped", False, "a grouped convolution with more than one input channel per group",
                    [n for n in convs if grouped(n)])
    elif any(map(in_out, convs)):
        v = verdict("in/out channels", False, f"a convolution with out_channels * {c['in_out_ratio']} <= "
                    "in_channels and a kernel wider than 1", [n for n in convs if in_out(n)])
    elif all(map(small, convs)):
        v = verdict("small channels", False, f"every convolution has at most {c['small_channels']} input and "
                    "output channels", convs)
    else:
        v = verdict("training rules passed", True, "training: no grouped convolution with more than one input "
                    f"channel per group, none with out_channels * {c['in_out_ratio']} <= in_channels, and not "
                    f"every convolution at most {c['small_channels']} channels", convs)
    return v


def explain_layout_opt(gm, *, is_inference: bool, decided: bool | None) -> dict:
    """Why ``decide_layout_opt`` decides as it does for the FX graph ``gm``: its rules replayed
    in the running torch's order with its numbers (:data:`._torch.LAYOUT_OPT_CONSTANTS`, checked
    against the running function), as ``layout_opt_rule`` (which rule decided), ``layout_opt_reason``
    (a sentence with the numbers), ``layout_opt_numbers``, ``layout_opt_tipped`` (the convolutions
    that decided it) and ``layout_opt_change`` (what the user could change). ``decided`` is what
    the running torch returned: a replay that disagrees says so instead of explaining."""
    c, problems = T.layout_opt_constants()
    config = T.inductor_config
    nodes = list(gm.graph.nodes)
    # torch 2.15 counts convolution_backward among the convolutions; 2.14 does not (the fence)
    counts_backward = T.layout_opt_counts_conv_backward()
    convs = [n for n in nodes if n.target is torch.ops.aten.convolution.default
             or (counts_backward and _is_conv_backward(n))]
    convs += [n for n in nodes if T.is_mkldnn_conv(n)]
    backward = sum(map(_is_conv_backward, nodes))
    numbers = {"convolutions": len(convs), "nodes": len(nodes)}
    if counts_backward and backward:
        numbers["convolution_backward among them"] = backward

    def verdict(rule, on, why, tipped=()):
        return {"rule": rule, "on": on, "why": why, "tipped": list(tipped)}

    def arg_val(n, i):
        """Argument ``i`` of a convolution's (input, weight): shifted by one for convolution_backward."""
        i += _is_conv_backward(n)
        return n.args[i].meta.get("val") if len(n.args) > i and hasattr(n.args[i], "meta") else None

    def grouped(n):
        w = _weight(n)
        return w is not None and isinstance(_groups(n), int) and _groups(n) > 1 and w.size(1) > 1

    def in_out(n):
        w = _weight(n)
        return w is not None and w.dim() > 2 and w.size(0) * c["in_out_ratio"] <= w.size(1) and w.size(2) > 1

    def small(n):
        w = _weight(n)
        return w is not None and w.size(0) <= c["small_channels"] and w.size(1) <= c["small_channels"]

    kinds = {n: "grouped" if grouped(n) else "small" if small(n) else "in_out" if in_out(n) else "default"
             for n in convs}
    flops: dict[str, float] = {}
    for n in convs:
        try:
            counted = T.count_flops_fx(n)
        except Exception:  # noqa: BLE001  (a node whose fake arguments cannot be rebuilt)
            counted = None
        if counted is not None:
            flops[kinds[n]] = flops.get(kinds[n], 0.0) + float(counted)
    total = sum(flops.values())
    if total:
        numbers["FLOP shares"] = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(flops.items()))

    if not config.layout_optimization:
        v = verdict("config off", False, "layout optimization is turned off (config.layout_optimization)")
    elif config.force_layout_optimization:
        v = verdict("forced", True, "forced on (config.force_layout_optimization)")
    elif not convs:
        why = "no convolution in the graph"
        if backward:
            why = (f"no convolution in the graph: its {backward} convolution_backward are not counted by "
                   f"torch {torch.__version__}'s rules (a backward graph follows the layouts its forward saved)")
        v = verdict("no convolution", False, why)
    else:
        v = _rules_with_convolutions(c, convs, nodes, numbers, flops, kinds, is_inference, verdict, arg_val,
                                     grouped, in_out, small)
    why = v["why"]
    if problems:
        why += (f" (this torch's decide_layout_opt lacks the numbers {', '.join(problems)} that auditor's replay "
                "uses: its rules changed)")
    if decided is not None and decided != v["on"]:
        why = (f"unexplained: torch {torch.__version__} decided {'on' if decided else 'off'} where auditor's replay "
               f"of its rules says {'on' if v['on'] else 'off'} ({v['why']})")
        v["rule"] = "unexplained"
    tipped = list(dict.fromkeys(_conv_name(n) for n in v["tipped"]))
    return {"layout_opt_rule": v["rule"], "layout_opt_reason": why,
            "layout_opt_numbers": "; ".join(f"{k} {x}" for k, x in numbers.items()),
            "layout_opt_tipped": "; ".join(tipped[:8]) + (f"; ... {len(tipped) - 8} more" if len(tipped) > 8 else ""),
            "layout_opt_change": _CHANGE.get(v["rule"], "")}


def read_graph(graph, emitted, path, compile_id: str, decision: dict | None):
    """(graph row, kernel rows, buffer rows) of a lowered ``graph``; ``emitted`` is the
    (kernel name, nodes, is extern) of each kernel, in the order the code generator wrote them."""
    phase, gid = _phase(graph), graph.graph_id
    calls = _call_args(graph)
    outputs = _output_names(graph)
    kernels, buffers, seen = [], [], set()
    for order, (name, nodes, is_extern) in enumerate(emitted):
        if is_extern or isinstance(nodes, T.inductor_ir.IRNode):
            seen.add(id(nodes))
            reads, writes, fx = _extern_io(graph, nodes)
            kind, moved = "extern", ""
        else:
            reads, writes, fx, kind, moved = _fused_io(graph, list(nodes), calls.get(name))
        source, module, sources = where_from(fx)
        kernels.append({"graph": gid, "phase": phase, "order": order, "kernel": name, "kind": kind, "source": source,
                        "module": module, "sources": sources, "fx_nodes": ";".join(n.name for n in fx),
                        "moves": moved})
        for role, bufs in (("read", reads), ("write", writes)):
            buffers.extend(_buffer_row(graph, gid, phase, order, role, b, n, outputs) for b, n in bufs)
    decision = dict(decision or {})
    log_lines = decision.pop("log", [])
    if not decision:  # the caller gave the layout (GraphLowering(layout_opt=...)): decide_layout_opt did not run
        decision = {"layout_opt_rule": "given", "layout_opt_reason": "given by the caller (freezing decides it once "
                    "for the inference graph)", "layout_opt_numbers": "", "layout_opt_tipped": "",
                    "layout_opt_change": ""}
    decision = {k: decision.get(k, "") for k in DECISION_COLUMNS}
    row = {"graph": gid, "phase": phase, "compile_id": compile_id, "layout_opt": bool(graph.layout_opt),
           **decision, "layout_opt_log": " | ".join(log_lines), "output_code": path or ""}
    return row, kernels, buffers


def _phase(graph) -> str:
    return "backward" if graph.is_backward else "inference" if graph.is_inference else "forward"


def _call_args(graph) -> dict[str, list[str]]:
    """Each kernel's arguments as the generated wrapper passes them."""
    return {line.kernel_name: [str(a) for a in line.call_args]
            for line in getattr(graph.wrapper_code, "lines", []) if isinstance(line, T.KernelCallLine)}


def _output_names(graph) -> set[str]:
    names = set()
    for out in graph.graph_outputs or []:
        try:
            names.add(out.get_name())
        except Exception:  # noqa: BLE001  (constants, None outputs, views of inputs)
            continue
    return names


def buffer_named(graph, name: str):
    if name in graph.graph_inputs:
        return graph.graph_inputs[name]
    if name in graph.name_to_buffer:
        return graph.name_to_buffer[name]
    real = getattr(graph.scheduler, "mutation_real_name", {}).get(name) if graph.scheduler else None
    return buffer_named(graph, real) if real is not None else None


def _named(graph, names) -> list:
    return [(buffer_named(graph, n), n) for n in names if buffer_named(graph, n) is not None]


def _fused_io(graph, schedule, args):
    """Reads, writes and FX nodes of a fused kernel. The writes are the buffers the call passes
    (those fused away are not written); a read that the call does not pass was reused in place,
    and is read through the written argument, still in its own layout."""
    inner = [s for node in schedule for s in node.get_nodes()]
    written = {b.get_name() for s in inner for b in s.get_outputs()}
    written |= {m for s in inner if s.node is not None for m in s.node.get_mutation_names()}
    reads = list(dict.fromkeys(d.name for s in inner for d in s.read_writes.reads
                               if type(d).__name__ != "WeakDep" and d.name not in written))
    removed = set(graph.removed_buffers) | set(getattr(graph, "inplaced_to_remove", ()))
    writes = [n for n in written if n not in removed]
    if args is not None:
        writes = [n for n in args if n in written]
        reads += [n for n in args if n not in written and n not in reads and buffer_named(graph, n) is not None]
    kind = "template" if any(isinstance(s.node, T.inductor_ir.TemplateBuffer) for s in inner) else "fused"
    return (_named(graph, reads), _named(graph, sorted(writes)), origins([s.node for s in inner if s.node is not None]),
            kind, moves(graph, inner, written))


def _unit_strides(graph, dep) -> dict | None:
    """Each loop variable's stride in one access of a generated loop (``MemoryDep``): how far
    the address moves when that variable steps from 0 to 1, the others at 0; None for an
    indirect access (a scatter or gather, whose address depends on loaded values)."""
    index, names, sizes = getattr(dep, "index", None), getattr(dep, "var_names", None), getattr(dep, "size", None)
    if index is None or names is None or sizes is None or dep.is_indirect():
        return None
    zero = {v: 0 for v in names}
    try:
        base = _hint(graph, index.subs(zero))
        out = {}
        for v, n in zip(names, sizes):
            if _hint(graph, n) > 1:
                out[v] = (_hint(graph, index.subs({**zero, v: 1})) - base, _hint(graph, n))
        return out
    except Exception:  # noqa: BLE001  (an index sympy cannot evaluate with hints)
        return None


def _order(strides: dict) -> tuple:
    """The loop variables an access covers, from its innermost (smallest stride) outwards."""
    return tuple(v for v, (st, _) in sorted(strides.items(), key=lambda kv: (abs(kv[1][0]), str(kv[0]))) if st)


def moves(graph, inner, written: set) -> str:
    """The (read buffer, written buffer, elements) a generated kernel moves from one physical
    order to another, as ``read>written:elements`` joined by ``;``: within one loop of the
    kernel, a store and a load that cover the same loop variables (element for element, no
    broadcast and no reduction between them) and step through them in a different order of
    strides. The buffers' declared ranks and sizes do not matter: a store into a buffer typed
    2-D, or into a permuted view, is judged by the addresses it writes."""
    found = {}
    for s in inner:
        body, sizes = getattr(s, "_body", None), getattr(s, "_sizes", None)
        if body is None or sizes is None:  # an extern or template node: no loop of its own
            continue
        rw = T.extract_read_writes(body, *sizes, normalize=False).rename(getattr(s, "mutation_renames", {}) or {})
        stores = [(d, _unit_strides(graph, d)) for d in rw.writes if d.name in written]
        loads = [(d, _unit_strides(graph, d)) for d in rw.reads if type(d).__name__ == "MemoryDep"]
        for w, ws in stores:
            if not ws:
                continue
            for r, rs in loads:
                if not rs or r.name == w.name or set(v for v, (st, _) in rs.items() if st) != \
                        set(v for v, (st, _) in ws.items() if st) or _order(rs) == _order(ws):
                    continue
                numel = 1
                for v in _order(ws):
                    numel *= ws[v][1]
                found.setdefault((r.name, w.name), numel)
    real = dict(getattr(graph.scheduler, "mutation_real_name", {}) if graph.scheduler is not None else {})
    for s in inner:  # a node that stores in place into another buffer (a scatter) is named after that buffer
        mutated = list(s.node.get_mutation_names()) if getattr(s, "node", None) is not None else []
        if mutated:
            real.setdefault(s.get_name(), mutated[0])

    def named(name: str) -> str:  # a store into a buffer in place is named after it, as the call passes it
        seen = set()
        while name in real and name not in seen:
            seen.add(name)
            name = real[name]
        return name

    moved = {}
    for (r, w), n in found.items():
        if named(r) != named(w):
            moved.setdefault((named(r), named(w)), n)
    return ";".join(f"{r}>{w}:{n}" for (r, w), n in moved.items())


def _extern_io(graph, node):
    """Reads, writes and FX nodes of an extern kernel: its inputs as it receives them (a view
    keeps its own layout) and its outputs (each output of a multi-output kernel)."""
    ir = T.inductor_ir
    reads = []
    for inp in getattr(node, "inputs", None) or []:
        if isinstance(inp, ir.IRNode):
            try:
                reads.append((inp, inp.get_name()))
            except Exception:  # noqa: BLE001  (an unnamed constant)
                continue
    if isinstance(getattr(node, "layout", None), ir.MultiOutputLayout):
        writes = [(b, b.get_name()) for b in graph.buffers
                  if isinstance(b, ir.MultiOutput) and b.inputs and b.inputs[0] is node]
    else:
        writes = [(node, node.get_name())]
    writes += _named(graph, node.get_mutation_names())
    fx = [node.origin_node] if getattr(node, "origin_node", None) is not None else origins([node])
    return reads, writes, fx


def _buffer_row(graph, gid, phase, order, role, node, name, outputs) -> dict:
    layout = layout_of(graph, node)
    shape, stride, dtype = layout if layout is not None else ((), (), None)
    return {"graph": gid, "phase": phase, "order": order, "role": role, "buffer": name,
            "shape": "x".join(map(str, shape)), "stride": ",".join(map(str, stride)),
            "dtype": str(dtype).replace("torch.", "") if dtype is not None else "",
            "itemsize": dtype.itemsize if dtype is not None else 0,
            "graph_input": name in graph.graph_inputs, "graph_output": name in outputs}
