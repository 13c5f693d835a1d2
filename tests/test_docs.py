"""The docs hold to the code: the README stays an entry page, every example is collected, the
tables that document a schema name its columns, the notebook's page is a run of the notebook,
and nothing points outside the repository. (The examples themselves run as tests of their own,
collected from README.md and docs/ by conftest.py; ``make docs`` checks links and docstrings.)"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from chromium_fit import needs_chromium, site_overflows

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_an_entry_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_every_page_with_python_examples_is_collected():
    """conftest.py's patterns reach every page that holds a ```python block."""
    import conftest

    patterns = ["README.md", "docs/*.md", "docs/*/*.md"]
    assert conftest.Sybil is not None, "sybil is not installed: the examples would not run"
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        if "```python" in page.read_text():
            rel = page.relative_to(ROOT).as_posix()
            assert any(fnmatch.fnmatch(rel, p) and rel.count("/") == p.count("/") for p in patterns), rel


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_stay_inside_the_repository_and_resolve(page):
    text = page.read_text()
    assert "shared/design.md" not in text
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} links to a missing file: {target}"
        if page.is_relative_to(DOCS):
            assert path.is_relative_to(DOCS), f"{page.name}: a site page links outside docs/: {target}"


def test_no_tracked_file_names_a_file_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    for name in files:
        if name.endswith((".py", ".md", ".toml", ".ipynb", ".yml", ".txt")) and name != "tests/test_docs.py":
            assert "shared/design.md" not in (ROOT / name).read_text(errors="replace"), name


def _table_rows(text: str) -> dict[str, str]:
    """Every ``| `name` | dtype | ...`` row of the Markdown tables in ``text``: name -> dtype."""
    rows = {}
    for names, dtype in re.findall(r"^\| ((?:`[a-z_0-9]+`(?:, )?)+) \| ([a-z0-9]+) \|", text, flags=re.M):
        for name in re.findall(r"`([a-z_0-9]+)`", names):
            rows[name] = dtype
    return rows


def test_the_event_log_page_is_the_schema():
    from auditor._recording._log import EVENT_COLUMNS, TENSOR_COLUMNS
    from auditor._recording._profile import HIDDEN_COLUMNS

    log = _table_rows((DOCS / "concepts" / "event-log.md").read_text())
    hidden = _table_rows((DOCS / "concepts" / "time.md").read_text())
    for columns, documented in ((EVENT_COLUMNS, log), (TENSOR_COLUMNS, log), (HIDDEN_COLUMNS, hidden)):
        for name, dtype in columns.items():
            assert documented.get(name) == str(dtype), f"{name}: the docs say {documented.get(name)}, the code {dtype}"


def test_the_notebook_page_is_a_run_of_the_notebook():
    """docs/render_notebook.py made it: the same code cells, with outputs and no errors."""
    source = json.loads((ROOT / "notebooks" / "profile_a_model.ipynb").read_text())
    rendered = json.loads((DOCS / "guides" / "profile_a_model.ipynb").read_text())
    code = lambda nb: ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]  # noqa: E731
    assert code(rendered) == code(source), "the notebook changed: run docs/render_notebook.py"
    outputs = [o for c in rendered["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert outputs and not [o for o in outputs if o["output_type"] == "error"]


def test_output_shapes_tolerate_timings_but_not_words():
    from conftest import check_output

    shown = "time: ops 892.5 µs, of which hotspots 614.4 µs (68.8%)\n  - backward 0,2  converts 2x 32.8 kB"
    assert check_output("shape", shown, "time: ops 1.2 ms, of which hotspots 14 µs (1.5%)\n  - backward 0,2  converts 2x 1 MB") is None
    assert check_output("shape", shown, "time: ops 1.2 ms, of which hotspots 14 µs (1.5%)\n  - backward 0,2  loses 2x 1 MB")
    assert check_output("shape", shown, "time: ops 1.2 ms, of which hotspots 14 µs (1.5%)")
    assert check_output(None, "a  \nb", "a\nb\n") is None


def test_measured_outputs_leave_only_the_timings_outcome_and_verdict_free():
    """``shape, measured``: a verification's outcome on this machine's noise (within noise,
    helps, hurts) and its verdict may differ from the page; its hotspots, outputs and every
    other word may not."""
    from conftest import check_output

    shown = ("  fix 1 [p]\n      hotspot groups 5 -> 0; same outputs and gradients\n"
             "      step 1.0 ms -> 1.1 ms: within noise: after / before 1.1 [0.9, 1.2] straddles 1; estimated 0 s\n"
             "      verdict: within noise")
    helps = shown.replace("within noise: after / before 1.1 [0.9, 1.2] straddles 1", "9.0% faster: saving 90 µs")
    helps = helps.replace("verdict: within noise", "verdict: helps")
    assert check_output("shape, measured", shown, helps) is None
    assert check_output("shape", shown, helps)  # plain shape holds the words
    assert check_output("shape, measured", shown, helps.replace("5 -> 0", "5 -> 2").replace("same", "OTHER"))
    wrapped = helps.replace(" [0.9, 1.2]", "\n        [0.9, 1.2]").replace("; estimated", "\n        ; estimated")
    assert check_output("shape, measured", shown, wrapped) is None  # the outcome wraps as long as it needs
    assert check_output("shape, measured", shown, helps.replace("verdict: helps", "verdict: helps\n  more"))


def test_output_shapes_let_rows_ranked_by_time_cross_the_cut_but_keep_their_number_and_form():
    from conftest import check_output

    ranked = "audit\n  - forward  conv5.0  aten.convolution.default  converts 1x 12.3 kB 406.6 µs\n" \
             "  - backward stage3.1–7  aten.convolution_backward.default  converts 7x 86.0 kB 781.2 µs\n" \
             "  ... and 33 more rows (71 hotspot groups)\ntotal 4 hotspots"
    crossed = ranked.replace("forward  conv5.0  aten.convolution.default", "backward stage4.1–3 aten.cat.default")
    assert check_output("shape", ranked, crossed) is None
    assert check_output("shape", ranked, ranked.replace("  - forward  conv5.0", "  - forward  conv5.0  extra"))
    assert check_output("shape", ranked, ranked.replace("\n  - forward  conv5.0  aten.convolution.default  converts 1x 12.3 kB 406.6 µs", ""))
    assert check_output("shape", ranked, ranked.replace("total 4 hotspots", "total 4 groups"))
    complete = ranked.replace("  ... and 33 more rows (71 hotspot groups)\n", "")
    assert check_output("shape", complete, complete.replace("conv5.0", "head.0"))
    assert check_output(None, "a\nb", "a\nc")


#: the pages issue 41 looked at: each must be in the site and laid out
SITE_PAGES = ("index.html", "getting-started.html", "guides/fixes.html", "guides/notebook.html",
              "guides/profile_a_model.html", "benchmarks.html")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs site, built strictly from this checkout into a scratch folder (``make docs``
    builds the same into ``site/``). Skips where the docs extra is not installed."""
    for name in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings"):
        pytest.importorskip(name, reason="the docs extra is not installed (make docs installs it)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.docs
@pytest.mark.slow
def test_every_table_and_block_of_the_site_fits_its_column_at_1400_px(site):
    """Every page of the built site, laid out by headless Chromium at a 1400 px window: no table
    wider than the page's column or scrolling inside itself (issue 41: the notebook page showed
    6 of 12 columns, Benchmarks 5 of 10), no code or output block cut at the right, no page that
    scrolls sideways."""
    browser = needs_chromium()
    found = site_overflows(site, browser)
    missing = [p for p in SITE_PAGES if p not in found]
    assert not missing, f"pages not laid out: {missing}"
    assert sum(v["tables"] for v in found.values()) >= 20
    bad = {page: v["bad"] for page, v in found.items() if v["bad"]}
    assert not bad, "\n".join(f"{page}: {b}" for page, lines in bad.items() for b in lines)


@pytest.mark.docs
def test_the_site_browses_from_disk_and_searches_there(site):
    """``site/index.html`` opened from disk: every link to a page names its file (no folder URL,
    which opens a directory listing from disk), and search runs without a server."""
    index = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'href="([^"#]+)"', index)
    pages = [u for u in links if not u.startswith(("http", "mailto:")) and not u.endswith((".css", ".js", ".png",
                                                                                          ".svg", ".ico", ".xml"))]
    assert len(pages) >= 20
    assert all(u.endswith((".html", ".ipynb")) for u in pages), [u for u in pages if not u.endswith(".html")]
    for u in pages:
        assert (site / u).is_file(), u
    assert 'class="md-search"' in index  # the search box
    # the offline plugin's index is a script, not a fetch a file:// page may not make
    assert (site / "search" / "search_index.js").is_file()
    scripts = re.findall(r'<script[^>]* src="([^"]+)"', index)
    assert scripts and not [s for s in scripts if "//" in s], scripts  # nothing loaded from the network


@pytest.mark.docs
@pytest.mark.slow
def test_search_finds_pages_from_disk_in_chromium(site):
    """Search from ``site/index.html`` opened as a file, no server, no network: Chromium refuses
    web workers there, which the vendored iframe-worker shim stands in for."""
    browser = needs_chromium()
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--virtual-time-budget=8000", "--window-size=1400,1000", "--dump-dom",
                           (site / "index.html").as_uri() + "?q=softmax"], capture_output=True, text=True, timeout=120)
    found = re.search(r'md-search-result__meta">(\d+) matching document', done.stdout)
    assert found and int(found.group(1)) >= 2, done.stdout[-1500:]
