"""The breadth corpus's models written the way users write them (benchmarks/user_models.py), each
run as the corpus runs it three ways: imported as a module, as the script being run
(``__main__``) and in a notebook cell executed by a Jupyter kernel. The same code gets the same
fixes, verified, each way (issue 38 item 6)."""

from __future__ import annotations

import re

import pytest
from test_breadth import _breadth

pytestmark = [pytest.mark.slow]

#: the inline channel shuffle (an edit of one statement) and a mean over H and W kept 4-D
MODELS = ["ShuffleNet", "SqueezeExcite"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    pytest.importorskip("nbclient")
    breadth = _breadth()
    out = tmp_path_factory.mktemp("breadth_user") / "breadth.csv"
    assert breadth.main(["--models", *MODELS, "--csv", str(out), "--timeout", "300", "--rounds", "2",
                         "--budget", "1"]) == 0
    return breadth, breadth.read_rows(out)


def test_the_user_models_are_in_the_corpus_three_ways():
    breadth = _breadth()
    ids = {e.id for e in breadth.corpus()}
    for name in breadth._user_models():
        assert {f"{source}/{name}" for source in breadth.USER_SOURCES} <= ids


def test_a_user_model_gets_the_same_fixes_verified_as_a_module_a_script_and_a_notebook_cell(rows):
    breadth, rows = rows
    models = [r for r in rows if r["row"] == "model"]
    assert sorted((m["source"], m["model"]) for m in models) == sorted(
        (s, n) for s in breadth.USER_SOURCES for n in MODELS)
    assert all(m["status"] == "ok" for m in models), [(m["model"], m["source"], m["error"]) for m in models]
    causes = [r for r in rows if r["row"] == "cause"]
    for name in MODELS:
        ways = {}
        for source in breadth.USER_SOURCES:
            mine = [c for c in causes if (c["source"], c["model"]) == (source, name)]
            assert mine and all(c["verified"] == "True" and c["automatic"] == "True" for c in mine), mine
            ways[source] = sorted((c["pattern"], re.search(r"(\d+)$", c["location"]).group(1), c["action"])
                                  for c in mine)  # the line: file.py:30, or Cell In[1], line 30
        assert ways["user_module"] == ways["user_script"] == ways["user_notebook"], ways
    shuffle = {c["source"]: c for c in causes if c["model"] == "ShuffleNet" and c["pattern"] == "channel_shuffle"}
    assert set(shuffle) == set(breadth.USER_SOURCES) and all(c["action"] == "edit source" for c in shuffle.values())
    assert shuffle["user_notebook"]["location"].startswith("Cell In[1], line ")
    patches = {m["source"]: m["patch_check"] for m in models if m["model"] == "ShuffleNet"}
    assert patches == {"user_module": "ok", "user_script": "ok",
                       "user_notebook": "no file: a notebook cell, fixed and verified in memory"}
