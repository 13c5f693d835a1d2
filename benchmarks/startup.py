"""What starting costs: ``import auditor`` beyond ``import torch``, and ``format-audit --help``.

    .venv/bin/python benchmarks/startup.py [--rounds 5] [--against REV]

Each round starts fresh interpreters, in an order rotated each round: ``import torch``,
``import torch, auditor``, ``format-audit --help`` (the console script's module, run as
``python -c``), and with ``--against REV`` the same two of this repository at a git revision,
extracted into a temporary folder. Wall time of the whole process, so interpreter start-up is
in every figure alike; ``auditor`` is judged as the paired difference to ``import torch`` in the
same round. Targets (issue "small surface"): ``import auditor`` adds at most 1 s to ``import
torch``; ``--help`` answers in under 2 s (medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

IMPORT_TORCH = "import torch"
IMPORT_AUDITOR = "import torch, auditor"
HELP = ("import sys, format_auditor_cli as c\n"
        "sys.argv = ['format-audit', '--help']\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass")
HELP_OLD = "import sys\nsys.argv = ['format-audit', '--help']\nfrom auditor.cli import main\nmain(['--help'])"


def _seconds(code: str, path: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=path, env={**os.environ, "PYTHONPATH": str(path)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _extract(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev, "auditor", *_top_modules(rev)], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _top_modules(rev: str) -> list[str]:
    names = subprocess.run(["git", "ls-tree", "--name-only", rev], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [n for n in names if n.startswith("format_auditor") and n.endswith(".py")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", metavar="REV", help="also time this git revision of the package")
    args = p.parse_args()
    variants = {"import torch": (IMPORT_TORCH, ROOT), "import auditor": (IMPORT_AUDITOR, ROOT),
                "format-audit --help": (HELP, ROOT)}
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        if args.against:
            old = _extract(args.against, Path(tmp))
            old_help = HELP if (old / "format_auditor_cli.py").exists() else HELP_OLD
            variants |= {f"import auditor @{args.against}": (IMPORT_AUDITOR, old),
                         f"format-audit --help @{args.against}": (old_help, old)}
        names = list(variants)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(_seconds(*variants[n]))
    torch_s = times["import torch"]
    print(f"{'':34} {'median s':>9} {'beyond import torch (paired median) s':>38}")
    for n in names:
        extra = statistics.median(t - b for t, b in zip(times[n], torch_s)) if "import auditor" in n else None
        print(f"{n:34} {statistics.median(times[n]):9.2f} {'' if extra is None else f'{extra:38.2f}'}")
    extra = statistics.median(t - b for t, b in zip(times["import auditor"], torch_s))
    help_s = statistics.median(times["format-audit --help"])
    print(f"\nimport auditor adds {extra:.2f} s (target <= 1 s): {'PASS' if extra <= 1 else 'FAIL'}")
    print(f"format-audit --help {help_s:.2f} s (target < 2 s): {'PASS' if help_s < 2 else 'FAIL'}")


if __name__ == "__main__":
    main()
