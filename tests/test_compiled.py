"""Compiled audits: the conversions Inductor's generated code makes, checked against that code.

The truth is read from the output code itself, independently of the audit: the strides the code
allocates and asserts for every buffer, which arguments each generated C++ kernel takes as
``const`` (reads) and which it writes, and the calls in ``call()``. A kernel converts when it
writes an image of the same sizes as one it reads, in another format. Compiling is slow on a
small machine: the models are tiny, most audits untimed, and one cache directory serves the run.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
from collections import defaultdict

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import auditor
from auditor import format_label
from auditor._analysis._compiled import KEPT, ONLY_COMPILED, REMOVED
from auditor._recording._torch import TorchInternalsError
from tests.kernels import convs_that_lose, needs_inductor

CL, CL3 = torch.channels_last, torch.channels_last_3d


@pytest.fixture(scope="module", autouse=True)
def inductor_cache():
    """One Inductor cache for the module's compiles, fresh, so that no cache built for another
    ISA setting is reused."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="auditor-inductor-") as path:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


# -- the truth, from the generated code ------------------------------------------------------------
_STRIDED = re.compile(r"(\w+) = empty_strided_cpu\((\([^()]*\)), (\([^()]*\))")
_ASSERTED = re.compile(r"assert_(?:size_stride|tensor_metadata)\((\w+), (\([^()]*\)), (\([^()]*\))")
_GROUPED = re.compile(r"assert_size_stride_grouped\((\([^()]*\)), (\(.*\)), 'input'\)")
_ALIAS = re.compile(r"^\s*(\w+) = (\w+); del \w+\s+# reuse", re.M)
_BINDING = re.compile(r"^(cpp_fused_\w+) = async_compile\.cpp_pybinding\((\[[^\]]*\]).*?\bkernel\(([^)]*)\)",
                      re.M | re.S)
_CALL = re.compile(r"^\s+(cpp_fused_\w+)\((.*)\)\s*$", re.M)


def _ints(text: str) -> tuple[int, ...]:
    """A tuple of sizes or strides from the code; a symbol (dynamic shapes) counts as 7, which
    keeps the order of the strides."""
    symbols = defaultdict(lambda: 7)
    return tuple(int(eval(p, {"__builtins__": {}}, symbols)) for p in text.strip("() ").split(",") if p.strip())


def _layouts(code: str) -> dict[str, tuple]:
    found = {}
    for name, size, stride in _STRIDED.findall(code) + _ASSERTED.findall(code):
        found[name] = (_ints(size), _ints(stride))
    for names, rest in _GROUPED.findall(code):
        sizes, strides = eval(rest, {"__builtins__": {}}, defaultdict(lambda: 7))
        for name, size, stride in zip(names.strip("()").replace(" ", "").split(","), sizes, strides):
            found[name] = (tuple(size), tuple(stride))
    for new, old in _ALIAS.findall(code):
        if old in found:
            found[new] = found[old]
    return found


_CONV_CALL = re.compile(r"(?:extern_kernels\.convolution|aten\.convolution_backward\.default)\((.*)\)\s*$", re.M)


def _top_args(text: str) -> list[str]:
    """A call's arguments, split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*out, cur.strip()] if cur.strip() else out


def _numel(sizes) -> int:
    n = 1
    for v in sizes:
        n *= v
    return n


def code_images(code: str, layouts: dict) -> tuple[set[int], set[str]]:
    """(element counts of the images, names of the weights) of one output file: what its
    convolutions read and write but their weights (a convolution's input and output; a
    convolution_backward's output gradient, input and input gradient)."""
    images, weights = set(), set()
    for line in code.splitlines():
        m = _CONV_CALL.search(line)
        if not m:
            continue
        args = _top_args(m.group(1))
        backward = "convolution_backward" in line
        first = args[0]
        sizes = _ints(_top_args(first[len("reinterpret_tensor("):-1])[1]) if first.startswith("reinterpret_tensor(") \
            else layouts.get(first, ((),))[0]
        if sizes:
            images.add(_numel(sizes))
        if backward and args[1] in layouts:
            images.add(_numel(layouts[args[1]][0]))
        weights.add(args[2] if backward else args[1])
    for sizes in re.findall(r"assert_tensor_metadata\(\w+, (\([^()]*\)), \([^()]*\), [\w.]+, "
                            r"'torch\.ops\.aten\.convolution\.default'\)", code):
        images.add(_numel(_ints(sizes)))
    return images, weights


def code_conversions(path: str) -> set[str]:
    """The C++ kernels of one output file that read an image in one format and write one of the
    same sizes in another (an image: as many elements as a convolution's output or input
    gradient in that file; a graph without convolutions counts every 4-D or 5-D buffer)."""
    code = open(path).read()
    layouts = _layouts(code)
    images, weights = code_images(code, layouts)
    # an argument is read when it is const or an in-out pointer, written when it is not const
    kinds = {k: [(t, p.split()[-1]) for t, p in zip(ast.literal_eval(v), params.split(","))]
             for k, v, params in _BINDING.findall(code)}
    found = set()
    for kernel, args in _CALL.findall(code):
        names = [a.strip() for a in args.split(",")]
        pointers = [(n, t, p) for n, (t, p) in zip(names, kinds[kernel]) if t.endswith("*")]
        fmts = {n: (layouts[n][0], format_label(*layouts[n])) for n, _, _ in pointers if n in layouts}
        reads = [fmts[n] for n, t, p in pointers if (t.startswith("const") or p.startswith("in_out")) and n in fmts]
        for n, t, _ in pointers:
            if t.startswith("const") or n not in fmts or len(fmts[n][0]) not in (4, 5):
                continue
            size, fmt = fmts[n]
            if images and _numel(size) not in images and n not in weights:
                continue
            if any(s == size and f != fmt and "ambiguous" not in f + fmt for s, f in reads):
                found.add(kernel)
    return found


def assert_conversions_match_the_code(a: auditor.Audit, more: set[str] = frozenset()) -> None:
    """Per lowered graph, the audit's conversion kernels are those the code has between buffers
    of the same sizes, and beyond them only kernels from the lines ``more`` (where the test's
    model stores an image into a buffer of another rank or permuted sizes)."""
    conv = a.compiled.conversions()
    for g in a.compiled.graphs().to_dict("records"):
        mine = set(conv.loc[(conv["graph"] == g["graph"]) & (conv["phase"] == g["phase"]), "kernel"])
        expected = code_conversions(g["output_code"])
        assert expected <= mine, (g["graph"], g["phase"], g["output_code"], expected - mine)
        ks = a.compiled.kernels()
        ks = ks[(ks["graph"] == g["graph"]) & (ks["phase"] == g["phase"]) & ks["kernel"].isin(mine - expected)]
        # a fused kernel came from several lines: one of them is where the test stores across sizes
        assert all(set(lines.split(";")) & set(more) for lines in ks["sources"]), \
            (g["graph"], g["phase"], g["output_code"], mine - expected)


# -- the models ------------------------------------------------------------------------------------
class CopyBetweenConvs(nn.Module):
    def __init__(self, graph_break: bool = False):
        super().__init__()
        self.c1, self.c2, self.graph_break = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), graph_break

    def forward(self, x):
        y = self.c1(x).relu()
        y = y.contiguous()  # COPY LINE
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.c2(y)


@torch.library.custom_op("auditor_test::contiguous_double", mutates_args=())
def contiguous_double(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).contiguous()


@contiguous_double.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


contiguous_double.register_autograd(lambda ctx, g: g * 2)


class CustomOpBetweenConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.c1(x)
        y = contiguous_double(y)  # CUSTOM OP LINE
        return self.c2(y)


def _line(model_class, marker: str) -> str:
    import inspect

    lines, start = inspect.getsourcelines(model_class)
    at = next(i for i, text in enumerate(lines) if marker in text)
    return f"{inspect.getsourcefile(model_class)}:{start + at}"


def _input(shape, fmt=CL):
    return torch.randn(*shape).to(memory_format=fmt).requires_grad_()


@pytest.fixture(scope="module")
def copy_audit():
    torch.manual_seed(0)
    return auditor.audit(CopyBetweenConvs().to(memory_format=CL), _input((2, 3, 16, 16)), compile=True)


# -- the cases -------------------------------------------------------------------------------------
def _assert_copy_removed_where_layout_opt(a: auditor.Audit) -> None:
    """The eager ``.contiguous()`` cause: removed when Inductor's layout optimization ran on the
    forward (the copy is written channels_last), still there with its kernel otherwise."""
    assert a.compiled
    assert_conversions_match_the_code(a)
    compared = auditor.compare_compiled(a, a)
    line = _line(CopyBetweenConvs, "COPY LINE")
    cause = compared[(compared["source"] == line) & compared["cause"].notna()]
    assert len(cause) == 1 and cause["phase"].iloc[0] == "forward"
    graphs = a.compiled.graphs()
    fw = graphs[graphs["phase"] == "forward"]
    if fw["layout_opt"].all():
        assert cause["status"].iloc[0] == REMOVED
        conv = a.compiled.conversions()
        assert not (conv["phase"] == "forward").any()
    else:
        assert cause["status"].iloc[0] == KEPT and cause["kernel"].iloc[0]


@needs_inductor
def test_contiguous_between_convs_is_removed_by_the_compiler(copy_audit):
    _assert_copy_removed_where_layout_opt(copy_audit)
    graphs = copy_audit.compiled.graphs()
    assert set(graphs["phase"]) == {"forward", "backward"}
    assert graphs["layout_opt_reason"].str.len().gt(0).all()
    # each graph's layout is explained by the rule that decided it, with its numbers
    forward, backward = (graphs[graphs["phase"] == p].iloc[0] for p in ("forward", "backward"))
    assert forward["layout_opt_rule"] not in ("", "unexplained") and "convolutions 2" in forward["layout_opt_numbers"]
    assert forward["layout_opt_tipped"] and forward["layout_opt_change"]
    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        assert forward["layout_opt_rule"] == "device rule" and forward["layout_opt"]
    from auditor._recording import _torch as T

    if T.layout_opt_counts_conv_backward():  # torch 2.15: the backward graph's convolution_backward count
        assert backward["layout_opt_rule"] == forward["layout_opt_rule"], backward
        assert "convolution_backward among them" in backward["layout_opt_numbers"]
    else:
        assert backward["layout_opt_rule"] == "no convolution" and "convolution_backward" in backward["layout_opt_reason"]
    text = copy_audit.report()
    assert "decided by" in text and "tipped by:" in text and "Times beside each cause" in text
    compared = auditor.compare_compiled(copy_audit, copy_audit)
    assert compared["time_note"].str.len().gt(0).all()
    assert graphs["convolutions"].str.contains("c1").all()
    assert graphs["time_us"].gt(0).all(), "a timed compiled audit gives every graph its kernels' time"


@needs_inductor
def test_contiguous_between_convs_with_dynamic_shapes():
    torch.manual_seed(0)
    a = auditor.audit(CopyBetweenConvs().to(memory_format=CL), _input((2, 3, 16, 16)), compile=True,
                      compile_options={"dynamic": True}, record_time=False)
    _assert_copy_removed_where_layout_opt(a)


@needs_inductor
def test_a_graph_break_between_the_convs():
    """Each graph's output keeps eager strides, so a conversion may cross the break; whatever
    the code does, the audit shows the same, and names the format each graph's images leave in."""
    torch.manual_seed(0)
    a = auditor.audit(CopyBetweenConvs(graph_break=True).to(memory_format=CL), _input((2, 3, 16, 16)), compile=True,
                      record_time=False)
    graphs = a.compiled.graphs()
    assert graphs["graph"].nunique() == 2
    assert_conversions_match_the_code(a)
    assert graphs["outputs"].str.len().gt(0).all()
    conv = a.compiled.conversions()
    assert conv["reason"].str.len().gt(0).all()


@needs_inductor
def test_conv3d_at_batch_1_copies_input_and_weight_where_this_cpu_has_no_kernel():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.ReLU()).to(memory_format=CL3)
    x = _input((1, 3, 8, 8, 8), CL3)
    loses = bool(convs_that_lose(model, (x.detach(),)))
    a = auditor.audit(model, x, compile=True, record_time=False)
    assert_conversions_match_the_code(a)
    conv = a.compiled.conversions()
    forward = conv[conv["phase"] == "forward"]
    if loses:  # eager writes contiguous: Inductor follows it and copies the input and the weight
        assert forward["weight"].any() and forward["buffers"].str.contains(r"\(input\)").any()
        assert forward["reason"].str.contains("2-D convolutions only").any()
    else:
        assert not forward["weight"].any()


@needs_inductor
def test_a_custom_op_returning_contiguous_keeps_one_conversion_at_its_line():
    torch.manual_seed(0)
    a = auditor.audit(CustomOpBetweenConvs().to(memory_format=CL), _input((2, 3, 16, 16)), compile=True,
                      record_time=False)
    assert_conversions_match_the_code(a)
    conv = a.compiled.conversions()
    forward = conv[conv["phase"] == "forward"]
    assert len(forward) == 1
    row = forward.iloc[0]
    assert row["source"] == _line(CustomOpBetweenConvs, "CUSTOM OP LINE")
    assert (row["from_format"], row["to_format"]) == ("contiguous", "channels_last")
    assert "contiguous_double" in row["reason"] and "fixed strides" in row["reason"]
    compared = auditor.compare_compiled(a, a)
    assert KEPT in set(compared["status"]) or ONLY_COMPILED in set(compared["status"])


@needs_inductor
def test_a_notebook_cell_s_line_is_named_alike_eager_and_compiled(monkeypatch):
    """In a notebook the eager log names a cell's line ``Cell In[5], line 7``; the compiled
    kernels name it the same, so the custom op's conversion meets its eager cause."""
    import sys

    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    code = ("class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)\n"
            "\n"
            "    def forward(self, x):\n"
            "        return self.c2(contiguous_double(self.c1(x)))\n")
    filename = compiler.cache(code, number=5)

    class Shell:
        compile = compiler

    ipython = type(sys)("IPython")
    ipython.get_ipython = lambda: Shell()
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    scope = {"nn": nn, "contiguous_double": contiguous_double}
    exec(compile(code, filename, "exec"), scope)
    torch.manual_seed(0)
    a = auditor.audit(scope["Net"]().to(memory_format=CL), _input((2, 3, 16, 16)), compile=True, record_time=False)
    conv = a.compiled.conversions()
    forward = conv[conv["phase"] == "forward"]
    assert list(forward["source"]) == ["Cell In[5], line 7"]
    compared = auditor.compare_compiled(a, a)
    mine = compared[(compared["source"] == "Cell In[5], line 7") & compared["cause"].notna()]
    assert list(mine["status"]) == [KEPT] and ONLY_COMPILED not in set(compared["status"])


@needs_inductor
def test_a_graph_input_in_another_format_is_converted_by_a_kernel():
    torch.manual_seed(0)
    a = auditor.audit(CopyBetweenConvs().to(memory_format=CL), _input((2, 3, 16, 16), torch.contiguous_format),
                      compile=True, record_time=False)
    assert_conversions_match_the_code(a)
    conv = a.compiled.conversions()
    inputs = conv[conv["reason"].str.contains("graph input in contiguous")]
    layout_opt = a.compiled.graphs().query("phase == 'forward'")["layout_opt"].all()
    assert len(inputs) == (1 if layout_opt else 0)
    if layout_opt:
        assert inputs.iloc[0]["phase"] == "forward" and inputs.iloc[0]["to_format"] == "channels_last"


@needs_inductor
@pytest.mark.slow
def test_a_zoo_model_compiled():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1(num_classes=10).to(memory_format=CL)
    a = auditor.audit(model, _input((2, 3, 32, 32)), compile=True, record_time=False)
    # the max-pool gradient is scattered into a buffer typed 2-D, in NCHW order, and read back into
    # channels_last (read by hand in squeezenet1_1's code, benchmarks/compiled_truth.json): those
    # kernels come from the line that runs the pooling layers (self.features), and the same-sizes
    # reader cannot pair them
    import inspect

    lines, start = inspect.getsourcelines(type(model).forward)
    pool = {f"{inspect.getsourcefile(type(model))}:{start + i}" for i, text in enumerate(lines)
            if "self.features(" in text}
    assert pool
    assert_conversions_match_the_code(a, more=pool)
    compared = auditor.compare_compiled(a, a)
    assert set(compared["status"]) <= {REMOVED, KEPT, ONLY_COMPILED}
    assert compared["cause"].notna().sum() == len(a.causes())


class ImagesMovedAcrossSizes(nn.Module):
    """Three stores that the same-sizes rule cannot judge: a permute that changes the sizes and
    moves the image, a 2-D buffer that holds the image, and per-position statistics (one value
    per sample and position, as a LayerNorm over channels keeps) transposed, which is no image."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = (nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1),
                                     nn.Conv2d(8, 8, 3, padding=1))
        self.register_buffer("shift", torch.zeros(1, 1, 10, 12))  # for a 12 x 10 input, transposed

    def forward(self, x):
        y = self.c1(x)
        n, c, h, w = y.shape
        z = y.permute(0, 1, 3, 2).contiguous()  # PERMUTE LINE
        s = torch.softmax(y.reshape(n * c, h * w), -1)  # TWO-D LINE
        m = y.mean(1, keepdim=True).relu()
        t = torch.cumsum(m.transpose(2, 3) + self.shift, -1)  # STATISTICS LINE (stored in the shift's order)
        return self.c2(z).sum() + self.c3(s.reshape(n, c, h, w)).sum() + t.sum()  # RETURN LINE


@needs_inductor
def test_images_stored_into_other_sizes_are_conversions_and_statistics_are_not():
    torch.manual_seed(0)
    a = auditor.audit(ImagesMovedAcrossSizes().to(memory_format=CL), _input((2, 3, 12, 10)), compile=True,
                      record_time=False)
    lines = {name: _line(ImagesMovedAcrossSizes, marker) for name, marker in
             (("permute", "PERMUTE LINE"), ("two_d", "TWO-D LINE"), ("statistics", "STATISTICS LINE"),
              ("return", "RETURN LINE"))}
    # the 2-D softmax output goes back to the convolution as (n, c, h, w) at the return line
    assert_conversions_match_the_code(a, more={lines["permute"], lines["two_d"], lines["return"]})
    conv = a.compiled.conversions()
    forward = conv[conv["phase"] == "forward"]
    kernels = a.compiled.kernels()
    sources = dict(zip(kernels.loc[kernels["phase"] == "forward", "kernel"],
                       kernels.loc[kernels["phase"] == "forward", "sources"]))
    for name in ("permute", "two_d"):  # a fused kernel is named by its first line, and lists every line it came from
        rows = forward[[lines[name] in sources.get(k, "").split(";") for k in forward["kernel"]]]
        assert len(rows), (name, forward[["kernel", "source", "buffers"]])
        assert rows["from_format"].str.contains("channels_last").any(), rows[["kernel", "from_format", "buffers"]]
    # the 2-D buffer goes back to the convolution in channels_last: a conversion from a 2-D buffer
    assert ((forward["from_format"].str.split("/").map(lambda f: "-" in f))
            & forward["to_format"].str.contains("channels_last")).any(), forward[["kernel", "from_format", "to_format"]]
    b = a.compiled._buffers  # the 2-D buffer is one of the softmax kernel's converted buffers
    two_d = forward[[lines["two_d"] in sources.get(k, "").split(";") for k in forward["kernel"]]].iloc[0]
    written = {p.split(" -> ")[1].split(" ")[0] for p in two_d["buffers"].split("; ")}
    order = kernels[(kernels["phase"] == "forward") & (kernels["kernel"] == two_d["kernel"])]["order"].iloc[0]
    shapes = set(b[(b["phase"] == "forward") & (b["order"] == order) & b["buffer"].isin(written)]["shape"])
    assert any(shape.count("x") == 1 for shape in shapes) or two_d["to_format"] == "channels_last", shapes
    # the statistics are moved (a kernel stores them transposed) but are no image: that move is
    # in no conversion row, whichever kernel it was fused into
    stats = {m.rsplit(":", 1)[0].replace(">", " -> ") for ms in kernels.loc[kernels["phase"] == "forward", "moves"]
             for m in ms.split(";") if m and int(m.rsplit(":", 1)[1]) == 2 * 12 * 10}
    assert stats, "the model's transposed statistics are a move of one value per position"
    listed = {p.split(" (")[0] for b in forward["buffers"] for p in b.split("; ")}
    assert not stats & listed, (stats, listed)


def test_the_conversion_rule_reads_moves_and_counts_images_only():
    """The rule on recorded rows, no compile: a move into a 2-D buffer of an image's element
    count is a conversion; the same move of a tensor with one value per position is not."""
    from auditor._analysis._compiled import conversions

    kernels = pd.DataFrame([
        {"graph": 0, "phase": "forward", "order": 0, "kernel": "extern_kernels.convolution", "kind": "extern",
         "source": "m.py:1", "module": "c1", "sources": "m.py:1", "fx_nodes": "", "moves": ""},
        {"graph": 0, "phase": "forward", "order": 1, "kernel": "cpp_fused_0", "kind": "fused",
         "source": "m.py:2", "module": "", "sources": "m.py:2", "fx_nodes": "", "moves": "buf1>buf2:1536"},
        {"graph": 0, "phase": "forward", "order": 2, "kernel": "cpp_fused_1", "kind": "fused",
         "source": "m.py:3", "module": "", "sources": "m.py:3", "fx_nodes": "", "moves": "buf3>buf4:192"}])
    row = {"graph": 0, "phase": "forward", "dtype": "float32", "itemsize": 4, "graph_input": False,
           "graph_output": False}
    buffers = pd.DataFrame([
        {**row, "order": 0, "role": "read", "buffer": "x", "shape": "2x3x12x8", "stride": "288,1,24,3"},
        {**row, "order": 0, "role": "read", "buffer": "w", "shape": "8x3x3x3", "stride": "27,1,9,3"},
        {**row, "order": 0, "role": "write", "buffer": "buf1", "shape": "2x8x12x8", "stride": "768,1,64,8"},
        {**row, "order": 1, "role": "read", "buffer": "buf1", "shape": "2x8x12x8", "stride": "768,1,64,8"},
        {**row, "order": 1, "role": "write", "buffer": "buf2", "shape": "16x96", "stride": "96,1"},
        {**row, "order": 2, "role": "read", "buffer": "buf3", "shape": "2x1x12x8", "stride": "96,96,8,1"},
        {**row, "order": 2, "role": "write", "buffer": "buf4", "shape": "2x1x8x12", "stride": "96,96,12,1"}])
    graphs = pd.DataFrame([{"graph": 0, "phase": "forward", "layout_opt": True}])
    conv = conversions(kernels, buffers, graphs)
    assert list(conv["kernel"]) == ["cpp_fused_0"]
    assert conv["buffers"].iloc[0] == "buf1 -> buf2" and conv["from_format"].iloc[0] == "channels_last"


# -- persistence, display, failures ----------------------------------------------------------------
@needs_inductor
def test_a_compiled_audit_round_trips_and_shows_itself(copy_audit, tmp_path):
    events, compiled = tmp_path / "events.csv", tmp_path / "compiled.csv"
    copy_audit.to_csv(events)
    copy_audit.compiled.to_csv(compiled)
    back = auditor.Audit.read_csv(events, compiled=compiled)
    assert back.compiled
    for table in ("conversions", "graphs", "kernels"):
        import pandas as pd

        pd.testing.assert_frame_equal(getattr(back.compiled, table)(), getattr(copy_audit.compiled, table)())
    pd.testing.assert_frame_equal(auditor.compare_compiled(back, back), auditor.compare_compiled(copy_audit, copy_audit))
    text = copy_audit.report()
    assert "Compiled step (torch.compile, Inductor)" in text and "removed by the compiler" in text
    assert "Graphs Inductor lowered" in copy_audit._repr_html_()
    assert auditor.Audit.read_csv(events).compiled is None
    with pytest.raises(ValueError, match="not compiled"):
        auditor.compare_compiled(copy_audit, auditor.Audit.read_csv(events))


@needs_inductor
def test_a_model_that_does_not_compile_gives_dynamos_reason():
    model = CopyBetweenConvs(graph_break=True).to(memory_format=CL)
    with pytest.raises(auditor.CompileError, match="graph_break|graph break"):
        auditor.audit(model, _input((2, 3, 16, 16)), compile=True, compile_options={"fullgraph": True},
                      record_time=False)


@pytest.mark.parametrize("version", ["2.99.0", "2.10.0", "2.8.0+cpu"])
def test_an_untested_torch_release_is_refused_with_its_version(monkeypatch, version):
    """Compiled audits read Inductor's internals, tested from one release on; an eager audit on
    the same torch works."""
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(TorchInternalsError, match=rf"compiled audits .*torch {re.escape(version)} is not one auditor "
                                                  "was tested on"):
        auditor.audit(CopyBetweenConvs(), _input((2, 3, 16, 16)), compile=True)


@needs_inductor
def test_changed_inductor_internals_are_refused(monkeypatch):
    from auditor._recording import _torch

    monkeypatch.setitem(_torch.INDUCTOR_SHAPES, "debug.set_kernel_post_grad_provenance_tracing",
                        ("node_schedule", "kernel_name", "no_such_parameter"))
    with pytest.raises(TorchInternalsError, match="set_kernel_post_grad_provenance_tracing"):
        _torch.require_inductor()


@needs_inductor
@pytest.mark.slow
def test_a_compiled_audit_keeps_torchs_device_noise_out_and_the_users_warnings_in():
    """Issue 29: on a machine without a GPU a compiled audit printed Kineto's "USDT ...
    profiler_start" and "ERROR ... gpuGetDeviceCount failed" lines and cpp_extension's "No CUDA
    runtime is found", in a notebook as on the command line. The library keeps them out (the
    profiler's own start and stop, that one log message); a warning of the user's model, and
    its prints, still show."""
    import subprocess
    import sys

    code = ("import warnings, torch, auditor\n"
            "class M(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.c = torch.nn.Conv2d(3, 4, 1)\n"
            "    def forward(self, x):\n"
            "        warnings.warn('the model speaks')\n"
            "        return self.c(x).softmax(1)\n"
            "auditor.audit(M(), torch.randn(1, 3, 8, 8), compile=True)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "TORCH_LOGS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    for noise in ("gpuGetDeviceCount", "USDT", "profiler_start", "No CUDA runtime is found"):
        assert noise not in done.stderr, done.stderr[-3000:]
    assert "the model speaks" in done.stderr


# -- why each graph has its layout: decide_layout_opt's rules, replayed -----------------------------
def _fx(fn, *shapes, mode: str = "fake"):
    """An FX graph of ``fn`` with the fake values Inductor's ``decide_layout_opt`` reads."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode=mode)(*[torch.randn(*s) for s in shapes])


def _decide(gm, *, inference: bool = False):
    """(the running torch's decision, auditor's explanation of it) for one graph."""
    from auditor._recording import _torch as T
    from auditor._recording._inductor_graph import explain_layout_opt

    decided = T.GraphLowering.decide_layout_opt(gm, is_inference=inference)
    return decided, explain_layout_opt(gm, is_inference=inference, decided=decided)


def _conv(groups: int = 1):
    return lambda x, w: F.conv2d(x, w, groups=groups).relu()


def _chain(n: int):
    """One convolution and ``n`` pointwise ops after it."""
    def fn(x, w):
        y = F.conv2d(x, w)
        for _ in range(n):
            y = y + 1
        return y
    return fn


WIDE = ((2, 128, 8, 8), (128, 128, 3, 3))

#: rule -> (graph on one side, graph on the other, inference): the first decides by the rule, the
#: second passes it; each is built from strides and channel counts, never from a model's name
RULES = {
    "few convolutions": (lambda c: _fx(_chain(c["nodes_per_conv"]), *WIDE), lambda c: _fx(_chain(3), *WIDE), False),
    "dynamic shapes": (lambda c: _fx(_conv(), *WIDE, mode="symbolic"), lambda c: _fx(_conv(), *WIDE), False),
    "grouped": (lambda c: _fx(_conv(2), (2, 128, 8, 8), (128, 64, 3, 3)), lambda c: _fx(_conv(), *WIDE), False),
    "in/out channels": (lambda c: _fx(_conv(), (2, 256, 8, 8), (256 // c["in_out_ratio"], 256, 3, 3)),
                        lambda c: _fx(_conv(), (2, 256, 8, 8), (256 // c["in_out_ratio"], 256, 1, 1)), False),
    "small channels": (lambda c: _fx(_conv(), (2, 3, 8, 8), (c["small_channels"], 3, 3, 3)),
                       lambda c: _fx(_conv(), (2, 3, 8, 8), (c["small_channels"] + 1, 3, 3, 3)), False),
    "inference FLOPs": (lambda c: _fx(_conv(2), (2, 128, 8, 8), (128, 64, 3, 3)), lambda c: _fx(_conv(), *WIDE), True),
}


@needs_inductor
@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_of_decide_layout_opt_is_explained_both_ways(rule):
    """With oneDNN off (so that the CPU rule does not decide first), each rule of the running
    torch's decide_layout_opt turns layout optimization off for one graph and lets the other
    through; auditor's replay agrees with the running torch both times, names the rule, its
    numbers and the convolution that tipped it, and says what to change."""
    from auditor._recording import _torch as T

    constants, problems = T.layout_opt_constants()
    assert not problems, f"this torch's decide_layout_opt lacks {problems}"
    decides, passes, inference = RULES[rule]
    with torch.backends.mkldnn.flags(enabled=False):
        off, why = _decide(decides(constants), inference=inference)
        on, why_not = _decide(passes(constants), inference=inference)
    assert (off, on) == (False, True)
    assert why["layout_opt_rule"] == rule, why
    assert why["layout_opt_tipped"] and why["layout_opt_change"]
    assert "convolutions 1" in why["layout_opt_numbers"] and "oneDNN disabled" in why["layout_opt_numbers"]
    assert why_not["layout_opt_rule"] == ("inference FLOPs passed" if inference else "training rules passed")
    if rule == "few convolutions":
        assert f"at least {constants['nodes_per_conv']}" in why["layout_opt_reason"]
    if rule == "inference FLOPs":
        assert "grouped 100%" in why["layout_opt_numbers"] and "weighted FLOPs / FLOPs 1.358" in why["layout_opt_numbers"]


@needs_inductor
def test_the_config_and_device_rules_are_explained_both_ways():
    from auditor._recording import _torch as T

    small = _fx(_conv(), (2, 3, 8, 8), (8, 3, 3, 3))  # every rule after the device rule turns it off
    assert torch.backends.mkldnn.is_available()
    on, why = _decide(small)
    assert on and why["layout_opt_rule"] == "device rule" and "cpu" in why["layout_opt_reason"]
    with torch.backends.mkldnn.flags(enabled=False):
        off, why = _decide(small)
        assert not off and why["layout_opt_rule"] == "small channels"
        with T.inductor_config.patch(force_layout_optimization=True):
            on, why = _decide(small)
            assert on and why["layout_opt_rule"] == "forced" and "force_layout_optimization" in why["layout_opt_change"]
    with T.inductor_config.patch(layout_optimization=False):
        off, why = _decide(small)
        assert not off and why["layout_opt_rule"] == "config off"
    off, why = _decide(_fx(lambda x: x.relu(), (2, 3, 8, 8)))
    assert not off and why["layout_opt_rule"] == "no convolution"


def _conv_backward(groups: int = 1):
    """A backward graph's convolution: only aten.convolution_backward, as autograd writes it."""
    def fn(g, x, w):
        return torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], groups,
                                                   [True, True, False])[:2]
    return fn


@needs_inductor
def test_a_backward_graph_is_explained_as_the_running_torch_counts_it():
    """torch 2.15's decide_layout_opt counts convolution_backward (input and weight at arguments 1
    and 2, groups at 9), 2.14's does not: the replay follows the running torch either way, and a
    grouped convolution_backward tips the grouped rule where it is counted."""
    from auditor._recording import _torch as T

    grouped = _fx(_conv_backward(2), (2, 128, 6, 6), (2, 128, 8, 8), (128, 64, 3, 3))
    plain = _fx(_conv_backward(), (2, 128, 6, 6), *WIDE)
    with torch.backends.mkldnn.flags(enabled=False):
        off, why = _decide(grouped)
        on, why_not = _decide(plain)
    assert "unexplained" not in why["layout_opt_rule"] + why_not["layout_opt_rule"], (why, why_not)
    if T.layout_opt_counts_conv_backward():
        assert (off, on) == (False, True)
        assert why["layout_opt_rule"] == "grouped" and why["layout_opt_tipped"]
        assert "convolution_backward among them 1" in why["layout_opt_numbers"]
        assert why_not["layout_opt_rule"] == "training rules passed"
    else:
        assert (off, on) == (False, False)
        for w in (why, why_not):
            assert w["layout_opt_rule"] == "no convolution" and "convolution_backward" in w["layout_opt_reason"]


@needs_inductor
def test_a_replay_that_disagrees_with_the_running_torch_says_so(monkeypatch):
    from auditor._recording import _torch as T
    from auditor._recording._inductor_graph import explain_layout_opt

    gm = _fx(_conv(), *WIDE)
    with torch.backends.mkldnn.flags(enabled=False):
        decided = T.GraphLowering.decide_layout_opt(gm, is_inference=False)
        why = explain_layout_opt(gm, is_inference=False, decided=not decided)
    assert why["layout_opt_rule"] == "unexplained" and "unexplained" in why["layout_opt_reason"]
