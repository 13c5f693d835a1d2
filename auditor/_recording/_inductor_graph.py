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


#: ``decide_layout_opt``'s debug lines, by their start, as the reason they give
_LOGGED = {
    "Skip layout opt because all convolution channels are too small":
        "every convolution has at most 64 input and output channels",
    "Skipped layout opt because only a few conv": "few convolutions for the graph's size (nodes >= 300 per conv)",
    "See perf regression with dynamic shape": "dynamic shapes: a convolution's input or weight has symbolic sizes",
    "Skip layout opt because found grouped convolution": "a grouped convolution with more than 1 channel per group",
    "Skip layout optimization because some convolutions have smaller out_channel":
        "a convolution with out_channels * 2 <= in_channels",
    "Skipped layout opt in inference because weighted flops": "inference: the flop-weighted estimate says slower",
}


def read_graph(graph, emitted, path, compile_id: str, log_lines):
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
            kind = "extern"
        else:
            reads, writes, fx, kind = _fused_io(graph, list(nodes), calls.get(name))
        source, module, sources = where_from(fx)
        kernels.append({"graph": gid, "phase": phase, "order": order, "kernel": name, "kind": kind, "source": source,
                        "module": module, "sources": sources, "fx_nodes": ";".join(n.name for n in fx)})
        for role, bufs in (("read", reads), ("write", writes)):
            buffers.extend(_buffer_row(graph, gid, phase, order, role, b, n, outputs) for b, n in bufs)
    row = {"graph": gid, "phase": phase, "compile_id": compile_id, "layout_opt": bool(graph.layout_opt),
           "layout_opt_reason": layout_opt_reason(graph, log_lines or []), "layout_opt_log": " | ".join(log_lines or []),
           "output_code": path or ""}
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
    return _named(graph, reads), _named(graph, sorted(writes)), origins([s.node for s in inner if s.node is not None]), kind


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


def layout_opt_reason(graph, log_lines: list[str]) -> str:
    """Why ``decide_layout_opt`` decided as it did, from its debug line or, for the rules that
    log nothing, from the inputs of its decision (config, the convolutions and their devices)."""
    for line in log_lines:
        for start, reason in _LOGGED.items():
            if line.startswith(start):
                return reason
    config = T.inductor_config
    if not config.layout_optimization:
        return "turned off (config.layout_optimization / TORCHINDUCTOR_LAYOUT_OPTIMIZATION=0)"
    if config.force_layout_optimization:
        return "forced on (config.force_layout_optimization)"
    targets = [str(n.target) for n in graph.module.graph.nodes if n.op == "call_function"]
    convs = sum(t == "aten.convolution.default" or T.is_mkldnn_conv(n)
                for t, n in zip(targets, (n for n in graph.module.graph.nodes if n.op == "call_function")))
    backward = targets.count("aten.convolution_backward.default")
    if graph.layout_opt:
        if torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available():
            return "on: oneDNN is available and every convolution runs on a CPU device (Inductor's CPU rule)"
        return "on: the training heuristics passed (channels, groups, convolutions per node)"
    if convs + backward == 0:
        return "no convolution in the graph"
    if convs == 0:
        return (f"this torch ({torch.__version__}) does not count the graph's {backward} convolution_backward "
                "as convolutions")
    return "off (no rule logged a reason)"
