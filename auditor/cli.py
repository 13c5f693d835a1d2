"""``format-audit`` / ``python -m auditor``: audit a model from the shell and write the files.

Argument parsing, model loading and file writing only; the work is done by the library.
Bad input gets one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

EXIT_USAGE = 2

FORMATS = ("channels_last", "channels_last_3d", "contiguous")
DTYPES = ("float32", "float64", "float16", "bfloat16")


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


def parse_input(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"--input must be comma-separated positive integers like 1,3,224,224, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"--input must be comma-separated positive integers like 1,3,224,224, got {text!r}")
    return dims


def load_model(spec: str):
    """``torchvision:NAME``, ``path/to/file.py:FACTORY`` or ``package.module:FACTORY`` -> a model.

    Factories are called with no arguments. torchvision models get random weights.
    """
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name:
        raise UsageError(f"MODEL must look like torchvision:resnet50, file.py:factory or pkg.mod:factory, got {spec!r}")
    if source == "torchvision":
        import torchvision

        try:
            return torchvision.models.get_model(name, weights=None)
        except ValueError:
            raise UsageError(f"unknown torchvision model {name!r}") from None
        except Exception as exc:  # building the model itself failed
            raise UsageError(f"torchvision model {name!r} could not be built: {exc}") from None
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"no such file: {source}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"{source} failed to import: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(source)
        except Exception as exc:
            raise UsageError(f"cannot import {source!r}: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, name, None)
    if factory is None or not callable(factory):
        raise UsageError(f"{source} has no factory {name!r}")
    try:
        return factory()
    except Exception as exc:
        raise UsageError(f"factory {spec} raised {type(exc).__name__}: {exc}") from None


def default_input(spec: str, fmt: str) -> tuple[int, ...]:
    if fmt == "channels_last_3d":
        return (1, 3, 16, 112, 112)
    if spec.endswith(":inception_v3"):
        return (1, 3, 299, 299)
    return (1, 3, 224, 224)


def _prepare_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".format-audit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return path


class Progress:
    """Progress on stderr: a bar redrawn in place on a terminal, one line per step otherwise
    (a CI log)."""

    def __init__(self, total: int, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def step(self, label: str) -> None:
        width = 20
        filled = int(width * self.done / max(1, self.total))
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.perf_counter() - self.start
        line = f"[{bar}] {self.done}/{self.total} {label:<48.48} {elapsed:6.1f}s"
        self.stream.write(f"\r{line}" if self.tty else line.rstrip() + "\n")
        self.stream.flush()

    def advance(self, label: str) -> None:
        self.done += 1
        self.step(label)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="format-audit",
        description="Audit where a model loses channels_last, what it costs, and where in the code.",
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="torchvision:NAME, path/to/file.py:FACTORY or package.module:FACTORY")
    p.add_argument("--input", default=None, help="input shape, e.g. 1,3,224,224 (default by model)")
    p.add_argument("--format", default="channels_last", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--no-backward", action="store_true", help="audit the forward pass only")
    p.add_argument("--device", default=None, help="target device, e.g. cpu or cuda (real runs: where to run)")
    p.add_argument("--fake", action="store_true",
                   help="run on fake tensors: the target's layout rules without its memory or compute")
    p.add_argument("--depth", type=int, default=1, help="module depth of the summary and heatmap")
    p.add_argument("--out", default=None, help="directory for the CSV, PNG and report files")
    p.add_argument("--record-source", action="store_true", help="record the source line of each op")
    p.add_argument("--top", type=int, default=10, help="hotspot groups shown in the report")
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    target = _Target.from_args(args)
    out = _prepare_out(args.out)
    several = len(args.models) > 1
    progress = Progress(len(args.models) * 3)
    reports = []
    for spec in args.models:
        name = spec.rpartition(":")[2]
        progress.step(f"{name}: building")
        model = load_model(spec)
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
        dims = target.input_shape(spec)
        progress.advance(f"{name}: recording")
        audit = target.audit(spec, model, dims)
        progress.advance(f"{name}: analysing")
        report = audit.report(top=args.top, depth=args.depth)
        if out is not None:
            folder = out / name if several else out
            folder.mkdir(parents=True, exist_ok=True)
            written = write_outputs(audit, folder, args.depth, report)
            report += "\n\nWrote: " + ", ".join(str(p) for p in written)
        reports.append(target.title(spec, dims) + "\n" + report)
        progress.advance(f"{name}: done")
    progress.close()
    print("\n\n".join(reports))
    return 0


class _Target:
    """What the flags say about the run: format, dtype, device, real or fake, and the input."""

    def __init__(self, args: argparse.Namespace, device):
        import torch

        self.args = args
        self.device = device
        self.dtype = getattr(torch, args.dtype)
        self.memory_format = {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d,
                              "contiguous": torch.contiguous_format}[args.format]
        self.shape = parse_input(args.input) if args.input else None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> _Target:
        import torch

        if args.format not in FORMATS:
            raise UsageError(f"unknown --format {args.format!r}; use one of {', '.join(FORMATS)}")
        if args.dtype not in DTYPES:
            raise UsageError(f"unknown --dtype {args.dtype!r}; use one of {', '.join(DTYPES)}")
        if args.depth < 1:
            raise UsageError(f"--depth must be at least 1, got {args.depth}")
        device = None
        if args.device is not None:
            try:
                device = torch.device(args.device)
            except (RuntimeError, ValueError):
                raise UsageError(f"unknown --device {args.device!r}; use e.g. cpu or cuda") from None
            if not args.fake and device.type == "cuda" and not torch.cuda.is_available():
                raise UsageError("--device cuda needs a GPU; add --fake to audit for cuda without one")
        return cls(args, device)

    def input_shape(self, spec: str) -> tuple[int, ...]:
        import torch

        dims = self.shape or default_input(spec, self.args.format)
        rank = 4 if self.args.format == "channels_last" else 5
        if self.memory_format is not torch.contiguous_format and len(dims) != rank:
            raise UsageError(f"--format {self.args.format} needs a {rank}-D --input, got {len(dims)}-D")
        return dims

    def audit(self, spec: str, model, dims: tuple[int, ...]):
        import torch

        import auditor

        args, fmt = self.args, self.memory_format
        torch.manual_seed(0)
        if args.fake:
            # parameters stay where they are; the fake audit moves fakes of them to the target
            model = model.to(memory_format=fmt)
            x = torch.empty(*dims, device="meta").to(memory_format=fmt)
            run_on = {"fake": True, "device": self.device or "cpu", "dtype": self.dtype}
        else:
            model = model.to(device=self.device, dtype=self.dtype, memory_format=fmt)
            x = torch.randn(*dims, dtype=self.dtype, device=self.device).to(memory_format=fmt)
            run_on = {}
        try:
            return auditor.audit(model, x, backward=not args.no_backward, record_source=args.record_source,
                                 **run_on)
        except (RuntimeError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"{spec} failed on input {','.join(map(str, dims))} {args.dtype}: {first}") from None

    def title(self, spec: str, dims: tuple[int, ...]) -> str:
        args = self.args
        where = f" {'fake ' if args.fake else ''}{self.device or 'cpu'}"
        return f"== {spec}  input {'x'.join(map(str, dims))} {args.dtype} {args.format}{where}" + (
            "" if not args.no_backward else "  (forward only)"
        )


def write_outputs(audit, target: Path, depth: int, report: str) -> list[Path]:
    """The audit's files: events.csv, hotspots.csv, summary.csv, coverage.csv, report.txt, and
    the heatmap and timeline PNGs."""
    files = {
        "events.csv": lambda p: audit.to_csv(p),
        "hotspots.csv": lambda p: audit.hotspots().to_csv(p, index=False),
        "summary.csv": lambda p: audit.summary(depth).to_csv(p, index=False),
        "coverage.csv": lambda p: audit.coverage().to_csv(p, index=False),
        "report.txt": lambda p: p.write_text(report + "\n"),
    }
    from . import plot
    from .recording.csvfile import atomic_write

    files["heatmap.png"] = lambda p: plot.save(plot.heatmap(audit, depth=depth), p, format="png")
    files["timeline.png"] = lambda p: plot.save(plot.format_timeline(audit), p, format="png")
    written = []
    for name, write in files.items():
        path = target / name
        atomic_write(path, write)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        sys.stderr.write(f"\nformat-audit: error: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(f"\nformat-audit: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nformat-audit: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
