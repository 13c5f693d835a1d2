"""Rewrite the output blocks of a page with what its examples print now (conftest.py checks them).

    OMP_NUM_THREADS=1 .venv/bin/python docs/update_outputs.py README.md docs/guides/fixes.md

Run it after a change that is meant to change what a page shows, then read the diff: the test
fails until the page shows what the code prints.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```$|^<!-- invisible-code-block: python\n(?P<hidden>.*?)^-->$"
                   r"|^(?P<head><!-- output(?:: shape(?:, measured)?)? -->\n```text\n)(?P<text>.*?)^```$", re.M | re.S)


def update(path: Path) -> bool:
    text = path.read_text()
    namespace: dict = {"__name__": "__main__"}
    printed = None
    out, last = [], 0
    import torch

    torch.manual_seed(0)
    for m in BLOCK.finditer(text):
        code = m.group("code") or m.group("hidden")
        if code is not None:
            line = text.count("\n", 0, m.start(m.lastgroup))
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile("\n" * line + code, str(path.resolve()), "exec"), namespace)
            printed = buf.getvalue()
        elif printed is not None:
            out += [text[last:m.start("text")], printed.rstrip("\n") + "\n"]
            last = m.end("text")
            printed = None
    out.append(text[last:])
    new = "".join(out)
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))  # this checkout's auditor, whatever an editable install points at
    for name in argv:
        print(f"{name}: {'updated' if update(Path(name)) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
