"""The ``format-audit`` command line's arguments, parsed before torch is imported.

The console script starts here: ``--help``, ``--version`` and a mistyped flag answer at once,
without the seconds ``import torch`` takes; a command line that parses goes on to
:mod:`auditor.cli`, which does the work. Like ``format_auditor_pytest``, this module lives
outside the ``auditor`` package, whose import loads torch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

FORMATS = ("channels_last", "channels_last_3d", "contiguous")
DTYPES = ("float32", "float64", "float16", "bfloat16")

#: Every file format-audit may write into a model's folder; one of them there means an audit.
OUTPUT_FILES = ("events.csv", "hotspots.csv", "causes.csv", "summary.csv", "coverage.csv", "report.txt",
                "heatmap.png", "timeline.png", "fixes.txt", "fixes.patch", "verify.csv", "trace.json",
                "conversions.csv", "graphs.csv", "compiled.csv", "report.html")

#: Input dimensions are indexed with 32-bit integers by many kernels, the element count with 64.
MAX_DIM = 2**31 - 1
MAX_NUMEL = 2**63 - 1

BUG_NOTE = "this is a bug in format-audit; please report it with the command line and --traceback output"

EPILOG = """\
exit status:
  0    the audit ran and nothing failed the run
  1    a finding failed the run: --strict stopped at the first loss of channels_last
  2    the model, its import, factory or input failed, a flag is wrong, --out already
       holds an audit (add --force) or cannot be written
  3    format-audit itself failed after the model ran (a bug: please report it)
  130  interrupted
"""


class Failure(Exception):
    """A failure already put in words: ``str()`` is the line to print after ``heading``, and
    ``status`` the exit status."""

    status: int
    heading: str


class Findings(Failure):
    """The audit found what the flags say fails the run (``--strict``)."""

    status = EXIT_FINDINGS
    heading = ""


class UsageError(Failure):
    """The user's model, import or input failed, or a flag is wrong."""

    status = EXIT_USAGE
    heading = "error: "


class InternalError(Failure):
    """format-audit failed after the user's model ran fine: a bug of ours."""

    status = EXIT_INTERNAL
    heading = "internal error: "


def parse_input(text: str) -> tuple[int, ...]:
    """The ``--input`` shape; checked here so an impossible one never reaches torch."""
    try:
        dims = tuple(int(p) for p in text.split(","))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"--input must be comma-separated positive integers like 1,3,224,224, got {text!r}")
    if max(dims) > MAX_DIM:
        raise UsageError(f"--input dimension {max(dims)} is too large: each must be below 2**31")
    if math.prod(dims) > MAX_NUMEL:
        raise UsageError(f"--input {text} has more elements than a tensor can index (2**63)")
    return dims


def at_least(flag: str, low: int = 1) -> Callable[[str], int]:
    """A parser ``type`` for a count flag of ``low`` or more. Like every check here it raises
    UsageError, which argparse lets through, so the message is ours and not "argument --top:
    invalid int value"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{flag} must be an integer, got {text!r}") from None
        if value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
        return value

    return parse


def one_of(flag: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser ``type`` for a flag with ``choices``, giving the one-line message for a value
    outside them before argparse's own check."""

    def parse(text: str) -> str:
        if text not in choices:
            raise UsageError(f"unknown {flag} {text!r}; use one of {', '.join(choices)}")
        return text

    return parse


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="format-audit",
        description="Audit where a model loses channels_last, what it costs, and where in the code.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="torchvision:NAME, timm:NAME, path/to/file.py:FACTORY or package.module:FACTORY")
    p.add_argument("--input", type=parse_input, metavar="N,C,H,W",
                   help="input shape (default: 1,3,224,224; 1,3,299,299 for inception_v3; "
                        "1,3,16,112,112 for channels_last_3d)")
    # `choices` lists the values in --help; the `type` check has already given its own message
    p.add_argument("--format", type=one_of("--format", FORMATS), choices=FORMATS, default="channels_last",
                   help="memory format of the model and the input (default: %(default)s)")
    p.add_argument("--dtype", type=one_of("--dtype", DTYPES), choices=DTYPES, default="float32",
                   help="dtype of the model and the input (default: %(default)s)")
    p.add_argument("--no-backward", action="store_true", help="audit the forward pass only")
    p.add_argument("--device", default=None,
                   help="target device, e.g. cpu or cuda; real runs run there (default: cpu)")
    p.add_argument("--fake", action="store_true",
                   help="run on fake tensors: the target's layout rules without its memory or compute")
    p.add_argument("--compile", action="store_true",
                   help="also compile the step with torch.compile (Inductor) and report the conversions its generated "
                        "code makes and which eager causes the compiler removes (writes conversions.csv, graphs.csv, "
                        "compiled.csv)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first op that loses channels_last and exit with status 1")
    p.add_argument("--record-source", action=argparse.BooleanOptionalAction, default=True,
                   help="record the source line of each op, so the causes name their lines (default: on)")
    p.add_argument("--record-time", action=argparse.BooleanOptionalAction, default=None,
                   help="measure each op's kernel time with torch's profiler, so causes rank by time "
                        "(default: on; fake audits have no times)")
    p.add_argument("--depth", type=at_least("--depth"), default=None,
                   help="module depth of the report's modules, summary.csv, the heatmap and the timeline (default: 1 "
                        "for the report and summary; for the plots, the shallowest depth that puts the hotspots in "
                        "two or more modules)")
    p.add_argument("--top", type=at_least("--top"), default=10,
                   help="causes shown in the report, each with its symptoms; the hotspot-group table shows "
                        "as many rows (default: %(default)s)")
    p.add_argument("--threads", type=at_least("--threads"), default=None, metavar="N",
                   help="torch's intra-op threads for the model, the fixes' checks and everything but the timed "
                        "steps (default: torch's own). The recorded step's times and the verification are "
                        "always taken at one thread in process CPU time, so they hold on a busy machine")
    p.add_argument("--html", action="store_true",
                   help="also write report.html with --out: the report as HTML tables (with --verify, the "
                        "measured savings first)")
    p.add_argument("--fix", action="store_true",
                   help="print the suggested fixes after the report, and write fixes.txt and fixes.patch (the "
                        "source edits as a diff) with --out (records source lines)")
    p.add_argument("--verify", action="store_true",
                   help="with --fix: prove each fix on the model (applied to a copy, re-audited, outputs and "
                        "gradients compared, the step timed before and after at one thread) and write verify.csv "
                        "with --out; not with --fake")
    p.add_argument("--warmup", type=at_least("--warmup", 0), default=None,
                   help="unrecorded steps before the recorded one, so times are a steady step's (default: 1 "
                        "when timing, else 0)")
    p.add_argument("--trace", action="store_true",
                   help="also write trace.json with --out: a Chrome trace for Perfetto or chrome://tracing")
    p.add_argument("--out", metavar="DIR",
                   help="write the audit's files there; one folder per model when several are given. "
                        "events.csv is the whole audit for Audit.read_csv: its first rows (version, complete, "
                        "error, category) are not ops, so in a spreadsheet filter its 'record' column to tensor "
                        "and event; hotspots.csv, causes.csv and summary.csv are plain tables")
    p.add_argument("--force", action="store_true", help="overwrite an audit already in --out")
    p.add_argument("--traceback", action="store_true", help="print the full traceback of a failure")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr: a bar on a terminal, one line per step in a log "
                        "(default: on, unless AUDITOR_PROGRESS=0)")
    p.add_argument("--version", action="version",
                   version=f"format-audit {_version('format-auditor')} (torch {_version('torch')})")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace | int:
    """The parsed command line, or the exit status of one that ends here (``--help``,
    ``--version``, a wrong flag, reported on stderr)."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a command line argparse has reported
        return exc.code
    except UsageError as exc:  # a flag's value, reported by its own check
        sys.stderr.write(f"format-audit: {exc.heading}{exc}\n")
        return exc.status


def quiet_device_noise(device: str | None) -> None:
    """Keep torch's device noise out of a CPU run's output, before torch is imported: the
    profiler's library (Kineto) writes "USDT ... profiler_start" and "ERROR ... gpuGetDeviceCount
    failed" lines straight to stderr on a machine without a GPU, and the compiler's C++ helper
    logs "No CUDA runtime is found". A level the user set in the environment is kept; a run on
    a GPU (``--device cuda``) keeps them."""
    if device is not None and not device.startswith("cpu"):
        return
    import logging

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above FATAL: Kineto prints nothing
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    """The ``format-audit`` console script: parse, then run the audit with :mod:`auditor.cli`."""
    args = parse(argv)
    if isinstance(args, int):
        return args
    quiet_device_noise(args.device)
    try:  # importing torch takes seconds: Ctrl-C there ends the run as anywhere else, without a traceback
        from auditor.cli import run_parsed
    except KeyboardInterrupt:
        sys.stderr.write("format-audit: interrupted while starting (importing torch): nothing was audited\n")
        return EXIT_INTERRUPTED
    return run_parsed(args)
