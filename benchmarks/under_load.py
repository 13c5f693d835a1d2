"""The demo's estimate against its verified saving with two busy processes on the machine.

    flock /tmp/bench.lock .venv/bin/python benchmarks/under_load.py [--busy 2] [--models demo]

Starts ``--busy`` processes that spin (``while True: pass``), then runs
``benchmarks/savings.py --verified MODEL`` twice, at torch's default thread count and at one
thread (an audit at the process's count, then ``Fixes.verify``), and stops the busy processes,
whatever happens. Target (issue 39): the estimate within 0.5-2x of the measured saving, or inside
its interval, at both thread counts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside the runs")
    parser.add_argument("--models", nargs="+", default=["demo"])
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OMP_NUM_THREADS", None)  # the default-threads run is at torch's own count
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    status = 0
    try:
        for threads in (None, 1):
            cmd = [sys.executable, str(ROOT / "benchmarks" / "savings.py"), "--verified", *args.models]
            if threads:
                cmd += ["--threads", str(threads)]
            print(f"$ {' '.join(cmd[1:])}   ({args.busy} busy processes)", flush=True)
            status |= subprocess.run(cmd, env=env, cwd=ROOT).returncode
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    return status


if __name__ == "__main__":
    sys.exit(main())
