"""Whether HTML tables fit a 1400 px window, asked of headless Chromium (issue 29: notebook and
report tables ran off the right edge; issue 41: the docs site's tables scrolled inside themselves,
hiding most columns). Shared by the notebook's, the command line's and the docs site's tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

WIDTH = 1400  #: the window the tables must fit
#: a notebook's output area at a 1400 px window: JupyterLab's prompt column and padding take about 100 px
NOTEBOOK_OUTPUT_WIDTH = 1300

#: appended to the page: after layout, every table whose right edge passes its box's, or that
#: scrolls inside itself, and a page that scrolls sideways, written into the DOM as JSON
_CHECK = """<script>
window.addEventListener('load', () => {
  const box = document.getElementById('fit-box') || document.querySelector('.md-content__inner') || document.body;
  const edge = box.getBoundingClientRect().right;
  const bad = [];
  const tables = document.querySelectorAll('table');
  tables.forEach((t, i) => {
    const right = t.getBoundingClientRect().right;
    const head = (t.caption && t.caption.textContent) || (t.rows[0] ? t.rows[0].textContent : '');
    if (right > edge + 0.5 || t.scrollWidth > t.clientWidth + 1) {
      bad.push(`table ${i} (${head.trim().replace(/\\s+/g, ' ').slice(0, 80)}): right edge ${Math.round(right)} px, `
               + `box ${Math.round(edge)} px, scrollWidth ${t.scrollWidth} > ${t.clientWidth}`);
    }
  });
  if (document.querySelector('.md-content__inner')) {  // a docs page: code and output blocks too
    document.querySelectorAll('.md-content__inner pre').forEach((p, i) => {
      const c = p.querySelector(':scope > code') || p;  // the theme scrolls the code inside the block
      if (p.scrollWidth > p.clientWidth + 1 || c.scrollWidth > c.clientWidth + 1
          || p.getBoundingClientRect().right > edge + 0.5) {
        const first = p.textContent.trim().split('\\n')[0].slice(0, 80);
        bad.push(`block ${i} (${first}): scrollWidth ${Math.max(p.scrollWidth, c.scrollWidth)} > ${c.clientWidth}`);
      }
    });
  }
  const page = document.documentElement.scrollWidth;
  if (page > window.innerWidth) bad.push(`the page scrolls sideways: ${page} > ${window.innerWidth} px`);
  const out = document.createElement('pre');
  out.id = 'fit-result';
  out.textContent = JSON.stringify({tables: tables.length, width: window.innerWidth, bad: bad});
  document.body.appendChild(out);
  if (window.parent !== window) window.parent.postMessage(out.textContent, '*');
});
</script>"""


def chromium() -> str | None:
    """The headless browser's command, or None where none is installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def needs_chromium() -> str:
    """The browser's command; skips the test (with the reason) where there is none."""
    found = chromium()
    if found is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    return found


def notebook_page(fragments: list[str]) -> str:
    """Notebook outputs (their ``text/html``) one below another in a box as wide as a notebook's
    output area at a 1400 px window, styled as JupyterLab styles rendered HTML tables."""
    body = "\n".join(f"<div class='output'>{f}</div>" for f in fragments)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>"
            "body{margin:0;font-family:sans-serif;font-size:13px}"
            f"#fit-box{{width:{NOTEBOOK_OUTPUT_WIDTH}px;padding:0 0 0 {WIDTH - NOTEBOOK_OUTPUT_WIDTH - 20}px}}"
            ".output{margin:8px 0}table{border-collapse:collapse}"
            "td,th{border:1px solid #ddd;padding:4px 6px;text-align:right}</style></head>"
            f"<body><div id='fit-box'>{body}</div></body></html>")


def overflows(page: str, folder: Path, name: str, browser: str, screenshot: Path | None = None) -> dict:
    """Lay ``page`` out in headless Chromium at :data:`WIDTH` px: ``{"tables": n, "bad": [...]}``,
    one line per table that does not fit. With ``screenshot``, also a PNG of the page there."""
    path = folder / f"{name}.html"
    checked = page.replace("</body>", _CHECK + "</body>") if "</body>" in page else page + _CHECK
    path.write_text(checked, encoding="utf-8")
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--disable-dev-shm-usage", "--virtual-time-budget=5000"]
    done = subprocess.run([*common, f"--window-size={WIDTH},1000", "--dump-dom", path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"<pre id=\"fit-result\">(.*?)</pre>", done.stdout, re.S)
    assert found, f"Chromium laid nothing out (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(found.group(1).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&"))
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*common, f"--window-size={WIDTH},{_height(page)}", f"--screenshot={screenshot}",
                        path.as_uri()], capture_output=True, timeout=120)
    return result


def _height(page: str) -> int:
    """A screenshot's height, tall enough for the page (Chromium shoots the window only)."""
    return min(16000, max(1200, len(page) // 6 + 500 * page.count("<img")))


def site_page_overflows(page: Path, browser: str, screenshot: Path | None = None) -> dict:
    """A built docs page (``site/....html``) laid out at :data:`WIDTH` px: its tables and code or
    output blocks that do not fit the page's column (they scroll inside themselves or pass its
    right edge). The checked copy is written beside the page, so its stylesheets and scripts load."""
    return overflows(page.read_text(encoding="utf-8"), page.parent, f"_fit_{page.stem}", browser, screenshot)


#: a page of one iframe per docs page, each :data:`WIDTH` px wide: it gathers what each page's
#: check posts, and writes them into the DOM once every page has answered
_HARNESS = """<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><script>
const pages = %s;
const found = {};
window.addEventListener('message', (e) => {
  const frame = [...document.querySelectorAll('iframe')].find((f) => f.contentWindow === e.source);
  if (frame) found[frame.dataset.page] = JSON.parse(e.data);
  if (Object.keys(found).length === pages.length) {
    const out = document.createElement('pre');
    out.id = 'fit-result';
    out.textContent = JSON.stringify(found);
    document.body.appendChild(out);
  }
});
for (const [page, src] of pages) {
  const f = document.createElement('iframe');
  f.dataset.page = page;
  f.src = src;
  f.style.width = '%dpx';
  f.style.height = '1000px';
  document.body.appendChild(f);
}
</script></body></html>"""


def site_overflows(site: Path, browser: str) -> dict[str, dict]:
    """Every page of a built docs site laid out at :data:`WIDTH` px, in one browser run (each in
    an iframe of that width): page -> ``{"tables": n, "bad": [...]}`` as :func:`overflows` gives.
    Pages that never report (a script error) are missing from the answer."""
    pages = [p for p in sorted(site.rglob("*.html")) if not p.name.startswith("_fit_") and p.name != "404.html"]
    copies = []
    for p in pages:
        text = p.read_text(encoding="utf-8")
        copy = p.with_name(f"_fit_{p.name}")
        copy.write_text(text.replace("</body>", _CHECK + "</body>") if "</body>" in text else text + _CHECK,
                        encoding="utf-8")
        copies.append((p.relative_to(site).as_posix(), copy.relative_to(site).as_posix()))
    harness = site / "_fit_all.html"
    harness.write_text(_HARNESS % (json.dumps(copies), WIDTH), encoding="utf-8")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-dev-shm-usage", f"--virtual-time-budget={2000 * len(pages)}",
                           f"--window-size={WIDTH + 40},1000", "--dump-dom", harness.as_uri()],
                          capture_output=True, text=True, timeout=600)
    found = re.search(r"<pre id=\"fit-result\">(.*?)</pre>", done.stdout, re.S)
    assert found, f"Chromium laid out no page of the site (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&"))
