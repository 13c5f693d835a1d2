"""Source edits applied in memory (the function's code swapped wherever it is held) and written
as a patch that git applies."""

from __future__ import annotations

import functools
import importlib.util
import linecache
import shutil
import subprocess
import sys
import textwrap
import traceback

import pytest

from auditor._fix._patch import (
    EditError,
    SourceEdit,
    live_functions,
    patch_functions,
    patch_target,
    source_lines,
    unified_diff,
)

MODULE = '''\
import functools

SCALE = 3


def helper(x):
    return x + 1


class Base:
    def value(self, x):
        return x


class Child(Base):
    def value(self, x):
        y = super().value(x)
        return y * SCALE


def make_adder(k):
    def add(x):
        return x + k
    return add


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


@traced
def decorated(x):
    return x - 1


def fails(x):
    a = x
    raise ValueError(a)
'''


@pytest.fixture
def mod(tmp_path, monkeypatch):
    path = tmp_path / "project" / "userlib.py"
    path.parent.mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("userlib", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "userlib", module)
    spec.loader.exec_module(module)
    return module


def _edit(module, old: str, new: str) -> SourceEdit:
    path = module.__file__
    lines = source_lines(path)
    n = next(i for i, line in enumerate(lines, 1) if line.strip() == old.strip())
    return SourceEdit(path, n, n, lines[n - 1], new)


def test_a_function_is_changed_wherever_it_is_held_and_put_back(mod):
    alias = mod.helper  # as `from userlib import helper` would hold it
    patch = patch_functions([_edit(mod, "    return x + 1", "    return x + 2")])
    assert mod.helper(1) == 3 and alias(1) == 3
    patch.undo()
    assert mod.helper(1) == 2 and alias(1) == 2
    patch.redo()
    assert alias(1) == 3
    patch.undo()


def test_a_method_that_calls_super_keeps_its_class_cell(mod):
    patch = patch_functions([_edit(mod, "        return y * SCALE", "        return y * SCALE * 2")])
    try:
        assert mod.Child().value(2) == 12
        assert patch.functions == ["Child.value"]
    finally:
        patch.undo()
    assert mod.Child().value(2) == 6


def test_a_closure_and_the_function_that_makes_it_both_change(mod):
    made = mod.make_adder(10)  # a closure made before the edit
    patch = patch_functions([_edit(mod, "        return x + k", "        return x + k + 100")])
    try:
        assert made(1) == 111 and mod.make_adder(10)(1) == 111
    finally:
        patch.undo()
    assert made(1) == 11 and mod.make_adder(10)(1) == 11


def test_a_decorated_function_changes_behind_its_wrapper(mod):
    patch = patch_functions([_edit(mod, "    return x - 1", "    return x - 5")])
    try:
        assert mod.decorated(10) == 5
    finally:
        patch.undo()
    assert mod.decorated(10) == 9


def test_lines_after_an_edit_that_adds_lines_keep_their_numbers(mod):
    """A traceback through the edited function names the file's real lines."""
    line = next(i for i, text in enumerate(source_lines(mod.__file__), 1) if "raise ValueError(a)" in text)
    patch = patch_functions([_edit(mod, "    a = x", "    a = x\n    a = a * 2\n    a = a + 0")])
    try:
        with pytest.raises(ValueError) as info:
            mod.fails(1)
        assert info.value.args == (2,)
        frames = traceback.extract_tb(info.value.__traceback__)
        assert frames[-1].filename == mod.__file__ and frames[-1].lineno == line
    finally:
        patch.undo()


def test_an_edit_of_a_file_that_changed_is_refused_before_anything_changes(mod):
    stale = SourceEdit(mod.__file__, 7, 7, "    return x + 7\n", "    return x + 2\n")
    with pytest.raises(EditError, match="not the text the fix was made for"):
        patch_functions([stale])
    assert mod.helper(1) == 2
    broken = _edit(mod, "    return x + 1", "    return x +")
    with pytest.raises(EditError, match="does not parse"):
        patch_functions([broken])
    made = mod.make_adder(10)  # a live closure whose cell the edited code would no longer use
    closure = _edit(mod, "        return x + k", "        return x + 1")
    with pytest.raises(EditError, match="outer variables"):
        patch_functions([closure])
    assert made(1) == 11 and mod.make_adder(10)(1) == 11


def test_a_notebook_cells_function_is_edited_through_linecache():
    """IPython compiles a cell under a temporary name and keeps its text in linecache."""
    name = "/tmp/ipykernel_0000/123456789.py"
    cell = "def cell_fn(x):\n    return x * 2\n"
    linecache.cache[name] = (len(cell), None, cell.splitlines(keepends=True), name)
    scope: dict = {}
    exec(compile(cell, name, "exec"), scope)
    try:
        assert live_functions(name, [2]) == [scope["cell_fn"]]
        patch = patch_functions([SourceEdit(name, 2, 2, "    return x * 2\n", "    return x * 3\n")])
        assert scope["cell_fn"](2) == 6
        patch.undo()
        assert scope["cell_fn"](2) == 4
        assert "is no file on disk" in patch_target(name)[1]
    finally:
        linecache.cache.pop(name, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_patch_applies_with_git_in_the_project(mod, tmp_path):
    root = tmp_path / "project"
    name, note = patch_target(mod.__file__)
    assert name == "userlib.py" and "project file" in note
    edit = _edit(mod, "    return x + 1", "    return x + 2")
    text = unified_diff([edit])
    assert text.startswith("# project file") and "-    return x + 1\n+    return x + 2\n" in text
    run = functools.partial(subprocess.run, cwd=root, check=True, capture_output=True, text=True)
    run(["git", "init", "-q"])
    (tmp_path / "fix.patch").write_text(text)
    run(["git", "apply", "--check", str(tmp_path / "fix.patch")])
    run(["git", "apply", str(tmp_path / "fix.patch")])
    assert "    return x + 2\n" in (root / "userlib.py").read_text()
    assert textwrap.dedent(MODULE).count("return x + 1") == 1


def test_edits_made_apart_in_one_function_keep_each_other(mod):
    """Two patches of one function (two fixes, two audits): each compiles it with the other in
    force, and taking one back leaves the other."""
    first = patch_functions([_edit(mod, "        y = super().value(x)", "        y = super().value(x) + 1")])
    second = patch_functions([_edit(mod, "        return y * SCALE", "        return y * SCALE * 10")])
    try:
        assert mod.Child().value(2) == (2 + 1) * 3 * 10
        first.undo()
        assert mod.Child().value(2) == 2 * 3 * 10
        first.redo()
        second.undo()
        assert mod.Child().value(2) == (2 + 1) * 3
    finally:
        first.undo()
        second.undo()
    assert mod.Child().value(2) == 6
    overlapping = _edit(mod, "        return y * SCALE", "        return y")
    first.redo()
    try:
        with pytest.raises(EditError, match="overlap"):
            patch_functions([overlapping, _edit(mod, "        return y * SCALE", "        return y * 2")])
        assert mod.Child().value(2) == 9  # the edit in force is untouched
    finally:
        first.undo()


def test_a_file_in_no_project_is_labelled_as_a_file_with_where_to_apply_it(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("x = 1\n")
    name, note = patch_target(str(path))
    assert name == "train.py" and note == f"file {path}, in no project (apply in {tmp_path} with patch -p1 -d {tmp_path})"


#: a user's script: the model defined in it, the shuffle written inline in forward between two
#: convolutions; run as ``python train.py`` it audits, fixes, verifies and writes the patch
SCRIPT = """\
import json
import sys

import torch
from torch import nn

import auditor


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        f = self.a(x)
        n, c, h, w = f.shape
        f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        return self.b(f)


def run():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 1), Block(8)).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    fixes = auditor.suggest_fixes(auditor.audit(model, x))
    fixes = fixes.verify(model, x, rounds=2, max_rounds=2, budget_s=1.0)
    v = fixes.verification
    fixes.apply(model)
    after = len(auditor.audit(model, x, record_time=False).hotspots())
    json.dump({"name": __name__, "fixes": fixes.frame[["pattern", "automatic", "suggestion"]].values.tolist(),
               "verify": v[["kind", "applied", "reason", "same_outputs"]].astype(str).values.tolist(),
               "hotspots_after": v["hotspots_after"].astype(str).tolist(), "applied_after": after,
               "patch": fixes.patch()}, sys.stdout)


if __name__ == "__main__":
    run()
"""


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch is not installed")
def test_a_model_defined_in_the_running_script_is_fixed_verified_and_patched(tmp_path):
    """``python train.py``: the fix applies to the script's own functions (__main__), is
    verified, and the patch names the file and applies; the same code imported as a module
    gets the same fixes and the same proof."""
    import json
    import os

    import auditor

    (tmp_path / "train.py").write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(auditor.__file__)))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    run = functools.partial(subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    script = run([sys.executable, "train.py"])
    assert script.returncode == 0, script.stderr
    imported = run([sys.executable, "-c", "import train; train.run()"])
    assert imported.returncode == 0, imported.stderr
    main, module = json.loads(script.stdout), json.loads(imported.stdout)
    assert (main["name"], module["name"]) == ("__main__", "train")
    assert main["fixes"] == module["fixes"] == [
        ["channel_shuffle", True, "        f = torch.nn.functional.channel_shuffle(f, 2)"]]
    assert main["verify"] == module["verify"] and main["verify"][0] == ["fix", "True", "", "True"]
    assert main["hotspots_after"] == ["0", "0"] and main["applied_after"] == 0
    patch = main["patch"]
    assert patch.startswith(f"# file {tmp_path / 'train.py'}, in no project") and "a//" not in patch
    assert ("-        f = f.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)\n"
            "+        f = torch.nn.functional.channel_shuffle(f, 2)\n") in patch
    (tmp_path / "fix.patch").write_text(patch)
    run(["patch", "-p1", "-d", str(tmp_path), "-i", str(tmp_path / "fix.patch")], check=True)
    assert "        f = torch.nn.functional.channel_shuffle(f, 2)\n" in (tmp_path / "train.py").read_text()
    again = json.loads(run([sys.executable, "train.py"], check=True).stdout)
    assert again["fixes"] == [] and again["applied_after"] == 0
