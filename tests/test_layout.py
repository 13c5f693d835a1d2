"""The package's layers and its public surface: imports flow one way, without cycles; four public
modules, few names, each documented."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "auditor"

#: Each layer may import the layers before it. The README's "How the code is laid out".
LAYERS = [
    ("_recording",),
    ("_analysis",),
    ("_display",),
    ("_measure",),
    ("_result", "_session", "_step"),
    ("_fix",),
    ("_plan",),
    ("_api", "_fake", "distributed", "plot", "cli", "demo", "testing", "__main__", "__init__"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module inside the package, names taken from it) for every import."""
    package = name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("auditor"):
                target = node.module.removeprefix("auditor").lstrip(".")
            else:
                continue
            modules = _modules()
            for a in node.names:  # `from . import analysis` imports the module, not a name
                sub = f"{target}.{a.name}".lstrip(".")
                if sub in modules or f"{sub}.__init__" in modules:
                    found.append((sub, []))
                else:
                    found.append((target, [a.name]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("auditor."):
                    found.append((a.name.removeprefix("auditor."), []))
    return found


def _layer(module: str) -> int:
    top = module.split(".")[0] or "__init__"
    return RANK[top]


def test_every_module_belongs_to_a_layer():
    for name in _modules():
        assert name.split(".")[0] in RANK, f"{name} is in no layer of LAYERS"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_imports_flow_down(name):
    """A layer imports the layers before it, private modules included (the packages below the
    entry points are all internal), never one after it."""
    path = _modules()[name]
    here = _layer(name)
    for target, _ in _imports(name, path):
        there = _layer(target) if target else RANK["__init__"]
        assert there <= here, f"{name} (layer {here}) imports {target} (layer {there})"
        if there == here and target.split(".")[0] != name.split(".")[0]:
            # side by side in one layer: only the entry points may use each other
            assert here == len(LAYERS) - 1 or (name, target) in {("_session", "_result"), ("_session", "_step")}, (
                name, target)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    modules = _modules()
    for name, path in modules.items():
        deps = set()
        for target, names in _imports(name, path):
            for n in names or [""]:
                full = f"{target}.{n}" if target else n
                if full in modules:
                    deps.add(full)
                elif target in modules or f"{target}.__init__" in modules:
                    deps.add(target if target in modules else f"{target}.__init__")
        graph[name] = deps - {name}
    state: dict[str, int] = {}

    def visit(n, trail):
        if state.get(n) == 1:
            raise AssertionError("import cycle: " + " -> ".join(trail + [n]))
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in graph.get(n, ()):
            visit(d, trail + [n])
        state[n] = 2

    for n in graph:
        visit(n, [])


def test_no_module_is_hidden_by_a_name_of_its_package():
    """``import auditor.x.y`` must give the module: a package that re-exports a function
    named like one of its modules hides the module behind the function."""
    import importlib

    for name in _modules():
        if "." not in name or name.endswith("__init__"):
            continue
        package, _, leaf = name.rpartition(".")
        pkg = importlib.import_module(f"auditor.{package}")
        module = importlib.import_module(f"auditor.{name}")
        assert getattr(pkg, leaf, module) is module, f"auditor.{package}.{leaf} is not the module"



#: The public modules: the facade, the test guard, the figures, distributed audits, and the two
#: commands (``format-audit``, ``python -m auditor.demo``). Everything else has a leading underscore.
PUBLIC = {"__init__": "auditor", "testing": "auditor.testing", "plot": "auditor.plot",
          "distributed.__init__": "auditor.distributed"}
COMMANDS = {"cli": "auditor.cli", "demo": "auditor.demo", "__main__": None}
MAX_PUBLIC_NAMES = 40


def test_only_the_facade_testing_plot_distributed_and_the_commands_are_public():
    public = {n for n in _modules() if not any(p.startswith("_") and not p.startswith("__") for p in n.split("."))}
    assert public == set(PUBLIC) | set(COMMANDS)


def test_the_public_names_are_few_and_each_is_documented():
    import importlib

    names = []
    for module in PUBLIC.values():
        mod = importlib.import_module(module)
        assert len(set(mod.__all__)) == len(mod.__all__), module
        for name in mod.__all__:
            assert (getattr(mod, name).__doc__ or "").strip(), f"{module}.{name} has no docstring"
            names.append(f"{module}.{name}")
    assert len(names) <= MAX_PUBLIC_NAMES, names
    for module in filter(None, COMMANDS.values()):
        assert importlib.import_module(module).__all__ == ["main"]


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n.startswith("_") and n.endswith("__init__")
                                        and n != "__init__"))
def test_an_internal_package_exports_nothing(name):
    """Its modules are imported by name: an ``__init__`` that re-exports them would load them all
    with the package, and make every shared helper look like an API."""
    tree = ast.parse(_modules()[name].read_text())
    assert [type(n) for n in tree.body] == [ast.Expr], f"{name} holds more than its docstring"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_serves_names_it_does_not_define(name):
    """No module-level ``__getattr__``: every name a module offers is one it defines or imports;
    the fence's looks up the torch entry points its table names, on their first read."""
    if name == FENCE:
        return
    tree = ast.parse(_modules()[name].read_text())
    assert not [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]

#: The one module that names torch's private entry points (README, "Which torch").
FENCE = "_recording._torch"


def _private_torch_names(tree: ast.AST) -> list[str]:
    """Private torch modules and functions a module's code names: ``from torch._x import``,
    ``from torch.utils import _pytree``, ``import torch._dynamo``, ``torch._C.f``."""
    found = []
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a chain counts once
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            parts = node.module.split(".") + [a.name for a in node.names]
            found += [node.module] if any(p.startswith("_") and not p.startswith("__") for p in parts) else []
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("torch.")
                      and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "torch":
                private = [p for p in chain if p.startswith("_") and not p.startswith("__")]
                found += [f"torch.{'.'.join(reversed(chain))}"] if private else []
    return found


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n != FENCE))
def test_only_the_fence_names_private_torch_entry_points(name):
    found = _private_torch_names(ast.parse(_modules()[name].read_text()))
    assert not found, f"{name} uses private torch names {sorted(set(found))}: take them from auditor.{FENCE}"


def test_the_fence_check_sees_private_names():
    code = "import torch\nfrom torch._C import x\nfrom torch.utils import _pytree\ny = torch._C._f\nz = torch.nn.Conv2d"
    assert _private_torch_names(ast.parse(code)) == ["torch._C", "torch.utils", "torch._C._f"]


def test_import_auditor_leaves_the_features_heavy_imports_to_the_features():
    """libcst (source edits), matplotlib (figures, units) and the Inductor-reading modules
    (compiled audits) load when a feature first needs them, not with ``import auditor``."""
    import subprocess
    import sys

    heavy = ["libcst", "matplotlib", "auditor._recording._inductor", "auditor._recording._inductor_graph",
             "auditor._fix._syntax", "auditor._fix._generators._joins", "auditor._display._axes", "auditor.plot"]
    code = f"import sys, auditor; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"
