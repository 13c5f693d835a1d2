"""``format-audit`` / ``python -m auditor``: audit a model from the shell and write the files.

Argument parsing, model loading and file writing only; the work is done by the library. A run
goes through stages, and the stage an exception escapes from, not its class, says whose failure
it is: importing, building and running the user's model are the user's (exit status 2), analysing
the audit and writing its files are format-audit's own (exit status 3). Either way the user gets
one line on stderr, and the traceback only with ``--traceback``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

import auditor
from format_auditor_cli import (
    BUG_NOTE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OUTPUT_FILES,
    Failure,
    Findings,
    InternalError,
    UsageError,
    parse,
)

from ._api import stages
from ._display import progress
from ._recording._files import atomic_write

__all__ = ["main"]


def one_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message: enough to say what went wrong."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@contextmanager
def blame(failure: type[Failure], what: str) -> Iterator[None]:
    """Run one stage of the audit: any exception escaping it becomes ``failure`` with the message
    "what: Type: message", the original kept as its cause for ``--traceback``."""
    try:
        yield
    except Failure:
        raise
    except Exception as exc:
        raise failure(f"{what}: {one_line(exc)}") from exc


def load_model(spec: str) -> torch.nn.Module:
    """``torchvision:NAME``, ``timm:NAME``, ``path/to/file.py:FACTORY`` or
    ``package.module:FACTORY`` -> a model.

    Factories are called with no arguments. torchvision and timm models get random weights.
    """
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name:
        raise UsageError(f"MODEL must look like torchvision:resnet50, timm:resnet50, file.py:factory "
                         f"or pkg.mod:factory, got {spec!r}")
    if source == "torchvision":
        model = _torchvision_model(name)
    elif source == "timm":
        model = _timm_model(name)
    else:
        factory = getattr(_import_source(source), name, None)
        if factory is None or not callable(factory):
            raise UsageError(f"{source} has no factory {name!r}")
        try:
            model = factory()
        except Exception as exc:
            raise UsageError(f"factory {spec} raised {one_line(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _torchvision_model(name: str) -> torch.nn.Module:
    import torchvision

    try:
        builder = torchvision.models.get_model_builder(name)
    except ValueError:
        raise UsageError(f"unknown torchvision model {name!r}") from None
    try:  # random weights, offline: a segmentation or detection builder would fetch its backbone's
        return builder(**random_weights(builder))
    except ValueError:
        raise UsageError(f"unknown torchvision model {name!r}") from None
    except Exception as exc:  # building the model itself failed
        raise UsageError(f"torchvision model {name!r} could not be built: {one_line(exc)}") from exc


def random_weights(builder: Callable) -> dict:
    """The arguments that build a torchvision model with random weights and fetch nothing:
    ``weights=None``, and ``weights_backbone=None`` where the builder takes it (lraspp, deeplab,
    fcn, the detectors default to downloading their backbone's weights)."""
    import inspect

    params = inspect.signature(builder).parameters
    return {"weights": None, **({"weights_backbone": None} if "weights_backbone" in params else {})}


def _timm_model(name: str) -> torch.nn.Module:
    try:
        import timm
    except ImportError:
        raise UsageError(f"timm:{name} needs timm, which is not installed (pip install timm)") from None
    if not timm.is_model(name):
        raise UsageError(f"timm has no model {name!r}")
    try:
        return timm.create_model(name, pretrained=False)
    except Exception as exc:
        raise UsageError(f"timm model {name!r} could not be built: {one_line(exc)}") from exc


def _import_source(source: str):
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"no such file: {source}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"{source} failed to import: {one_line(exc)}") from exc
        return module
    try:
        return importlib.import_module(source)
    except Exception as exc:
        raise UsageError(f"cannot import {source!r}: {one_line(exc)}") from exc


def default_input(spec: str, fmt: str) -> tuple[int, ...]:
    if fmt == "channels_last_3d":
        return (1, 3, 16, 112, 112)
    if spec.endswith(":inception_v3"):
        return (1, 3, 299, 299)
    return (1, 3, 224, 224)


def folder_names(specs: list[str]) -> list[str]:
    """One folder per model, named after its factory; a name already taken in this run gets
    ``-2``, ``-3``, ... so two models never write into one folder."""
    taken: set[str] = set()
    names = []
    for spec in specs:
        base = name = spec.rpartition(":")[2]
        count = 1
        while name in taken:
            count += 1
            name = f"{base}-{count}"
        taken.add(name)
        names.append(name)
    return names


def prepare_out(out: str | None, specs: list[str], force: bool) -> list[Path | None]:
    """The folder each model's files go to, created and writable; a folder that already holds
    an audit is refused unless ``force``, before any model runs."""
    if out is None:
        return [None] * len(specs)
    root = Path(out)
    folders = [root / name for name in folder_names(specs)] if len(specs) > 1 else [root]
    for folder in folders:
        existing = [name for name in OUTPUT_FILES if (folder / name).exists()]
        if existing and not force:
            raise UsageError(f"--out {folder} already holds an audit ({', '.join(existing)}); "
                             "add --force to overwrite it")
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".format-audit-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"--out {folder}: cannot write there ({exc.strerror or exc})") from None
    return folders


class Progress:
    """Progress on stderr, one step per stage of each model (building, recording, analysing,
    suggesting fixes, writing files): a ``tqdm`` bar redrawn in place on a terminal, one line per
    step otherwise (a CI log), nothing when switched off (``--no-progress``,
    ``AUDITOR_PROGRESS=0``)."""

    def __init__(self, total: int, stream=None, enabled: bool | None = None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.on = progress.enabled(enabled)
        self.start = time.perf_counter()
        self.bar = None
        if self.on and self.tty:
            self.bar = progress.bar(total=total, desc="format-audit", flag=True, file=self.stream, leave=True,
                                    unit="step", dynamic_ncols=True,
                                    bar_format="{desc} [{bar:20}] {n_fmt}/{total_fmt} {elapsed}")

    def step(self, label: str) -> None:
        """Show the stage now running."""
        if not self.on:
            return
        if self.bar is not None:
            self.bar.set_description_str(label, refresh=True)
            return
        width = 20
        filled = int(width * self.done / max(1, self.total))
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"[{bar}] {self.done}/{self.total} {label:<56.56}".rstrip() + f" {elapsed:6.1f}s\n")
        self.stream.flush()

    def advance(self, label: str) -> None:
        """Count one stage as done and show the next."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        self.step(label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def stages_per_model(args: argparse.Namespace) -> int:
    """Progress steps of one model: building, recording, analysing, [suggesting fixes], [verifying
    them], [writing files]."""
    return 3 + bool(args.fix) + bool(args.fix and args.verify) + (args.out is not None)


@dataclass
class ModelAudit:
    """One model's audit and the texts made from it, as printed and written."""

    audit: auditor.Audit
    depth: int | None  # None: 1 for the tables, plot.hotspot_depth for the plots
    report: str
    fixes: str | None
    trace: bool = False  # write trace.json
    suggested: auditor.Fixes | None = None  # with --fix: writes fixes.patch
    verified: object = None  # with --verify: the verification of Fixes.verify(), written as verify.csv
    html: bool = False  # write report.html
    top: int = 10
    title: str = ""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C after some of a model's stages finished: ``written`` is what was saved of them,
    ``missing`` what the run did not get to; ``text`` the part of the report that is done."""

    def __init__(self, stage: str, written: list[Path], missing: list[str], text: str = ""):
        super().__init__(stage)
        self.stage, self.written, self.missing, self.text = stage, written, missing, text

    def line(self) -> str:
        wrote = f"wrote {', '.join(str(p) for p in self.written)}" if self.written else "wrote nothing"
        return (f"interrupted while {self.stage}: {wrote}"
                + (f"; missing: {', '.join(self.missing)}" if self.missing else ""))


def run(args: argparse.Namespace) -> int:
    """Every model in turn; a failure stops the run and reaches :func:`main` as an exception."""
    target = Target.from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    folders = prepare_out(args.out, args.models, args.force)
    bar = Progress(len(args.models) * stages_per_model(args), enabled=args.progress)
    texts = []
    try:
        for i, (spec, folder) in enumerate(zip(args.models, folders), 1):
            try:
                texts.append(audit_model(spec, folder, target, bar, f"({i}/{len(args.models)})"))
            except Interrupted as stop:
                if stop.text:
                    texts.append(stop.text)
                raise
    finally:  # what finished is printed even when a later model fails
        bar.close()
        if texts:
            print("\n\n".join(texts))
    return EXIT_OK


def audit_model(spec: str, folder: Path | None, target: Target, progress: Progress, count: str = "") -> str:
    """Build, audit, analyse and write one model; the text to print for it. ``count`` says
    which model of the run this is (``(2/3)``), for the progress lines. Ctrl-C after the step
    was recorded writes what is finished into ``folder`` and raises :class:`Interrupted`."""
    args = target.args
    name = f"{spec.rpartition(':')[2]} {count}".rstrip()
    progress.step(f"{name}: building")
    with blame(UsageError, f"{spec} could not be loaded"):
        model = load_model(spec)
    dims = args.input or default_input(spec, args.format)
    progress.advance(f"{name}: {'compiling' if args.compile else 'recording'}")
    with stages(lambda stage: progress.step(f"{name}: {stage}")):  # --compile: compiling, then recording
        audit, model, x = target.audit(spec, model, dims)
    title = target.title(spec, dims)
    done = {"audit": audit}
    stage = "analysing the audit"
    try:
        progress.advance(f"{name}: analysing")
        with blame(InternalError, f"analysing {spec}"):
            done["report"] = audit.report(top=args.top, depth=args.depth or 1)
        if args.fix:
            stage = "suggesting fixes"
            progress.advance(f"{name}: suggesting fixes")
            with blame(InternalError, f"analysing {spec}"):
                done["suggested"] = auditor.suggest_fixes(audit)
            done["fixes"] = str(done["suggested"])
            if args.verify:
                stage = "verifying fixes"
                progress.advance(f"{name}: verifying fixes")
                with blame(InternalError, f"verifying the fixes of {spec}"):
                    done["suggested"] = done["suggested"].verify(model, x, backward=not args.no_backward)
                    done["verified"] = done["suggested"].verification
                with blame(InternalError, f"analysing {spec}"):  # the measured savings lead
                    done["report"] = audit.report(top=args.top, depth=args.depth or 1,
                                                  verification=done["verified"])
    except KeyboardInterrupt:
        _interrupted(spec, folder, target, done, stage, title)
    result = _result(target, done, title)
    text = title + "\n" + "\n\n".join(t for t in (result.report, result.fixes) if t is not None)
    if folder is not None:
        progress.advance(f"{name}: writing files")
        with blame(InternalError, f"writing the files of {spec}"):
            written = write_outputs(result, folder)
        text += "\n\nWrote: " + ", ".join(str(p) for p in written)
    progress.advance(f"{name}: done")
    return text


def _result(target: Target, done: dict, title: str = "") -> ModelAudit:
    args = target.args
    return ModelAudit(done["audit"], args.depth, done.get("report"), done.get("fixes"), trace=args.trace,
                      suggested=done.get("suggested"), verified=done.get("verified"), html=args.html, top=args.top,
                      title=title)


def _interrupted(spec: str, folder: Path | None, target: Target, done: dict, stage: str, title: str):
    """Ctrl-C during ``stage``: write the finished parts of this model's audit (the event log
    always, the report and the tables once analysed, the fixes once suggested), then raise
    :class:`Interrupted` saying what is missing. A second Ctrl-C while writing is not caught."""
    args = target.args
    stages = (("the analysis (report, tables, plots)", "report", True), ("the fixes", "suggested", args.fix),
              ("the verification", "verified", args.fix and args.verify))
    missing = [what for what, key, wanted in stages if wanted and key not in done]
    written: list[Path] = []
    if folder is not None:
        result = _result(target, done, title)
        if result.report is None:  # not analysed: the event log alone, which Audit.read_csv reads back
            atomic_write(folder / "events.csv", result.audit.to_csv)
            written = [folder / "events.csv"]
        else:
            written = write_outputs(result, folder)
    text = title + "\n" + "\n\n".join(t for t in (done.get("report"), done.get("fixes")) if t is not None) \
        if "report" in done else ""
    raise Interrupted(f"{stage} for {spec}", written, missing, text)


class Target:
    """What the flags say about the run: format, dtype, device, real or fake."""

    def __init__(self, args: argparse.Namespace, device: torch.device | None):
        self.args = args
        self.device = device
        self.dtype = getattr(torch, args.dtype)
        self.memory_format = {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d,
                              "contiguous": torch.contiguous_format}[args.format]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Target:
        """The checks that need several flags at once; each flag alone was checked by the parser."""
        if args.trace and args.out is None:
            raise UsageError("--trace writes trace.json into the --out folder: give --out DIR too")
        if args.html and args.out is None:
            raise UsageError("--html writes report.html into the --out folder: give --out DIR too")
        if args.fake and args.record_time:
            raise UsageError("--record-time: fake tensors run no kernels, so a fake audit has no times")
        if args.verify and not args.fix:
            raise UsageError("--verify proves the suggested fixes: give --fix too")
        if args.compile and args.fake:
            raise UsageError("--compile runs the compiled step for real: it cannot run on --fake tensors")
        if args.verify and args.fake:
            raise UsageError("--verify runs the fixes for real and times them: it cannot run on --fake tensors")
        rank = {"channels_last": 4, "channels_last_3d": 5}.get(args.format)
        if args.input and rank and len(args.input) != rank:
            raise UsageError(f"--format {args.format} needs a {rank}-D --input, got {len(args.input)}-D")
        device = None
        if args.device is not None:
            try:
                device = torch.device(args.device)
            except (RuntimeError, ValueError):
                raise UsageError(f"unknown --device {args.device!r}; use e.g. cpu or cuda") from None
            if not args.fake and device.type == "cuda" and not torch.cuda.is_available():
                raise UsageError("--device cuda needs a GPU; add --fake to audit for cuda without one")
        return cls(args, device)

    def audit(self, spec: str, model: torch.nn.Module, dims: tuple[int, ...]) -> tuple[auditor.Audit, object, object]:
        """The recorded step (and the model and input it ran): whatever fails in it, from moving
        the model to its last backward op, is the user's model or input failing."""
        args, fmt = self.args, self.memory_format
        options = {"backward": not args.no_backward, "strict": args.strict, "warmup": args.warmup}
        if args.compile:
            options["compile"] = True
        options["record_source"] = args.record_source or args.fix
        options["record_time"] = args.record_time if args.record_time is not None else not args.fake
        with blame(UsageError, f"{spec} failed on input {','.join(map(str, dims))} {args.dtype}"):
            torch.manual_seed(0)
            if args.fake:
                # parameters stay where they are; the fake audit moves fakes of them to the target
                model = model.to(memory_format=fmt)
                x = torch.empty(*dims, device="meta").to(memory_format=fmt)
                options.update(fake=True, device=self.device or "cpu", dtype=self.dtype)
            else:
                model = model.to(device=self.device, dtype=self.dtype, memory_format=fmt)
                x = torch.randn(*dims, dtype=self.dtype, device=self.device).to(memory_format=fmt)
            try:
                return auditor.audit(model, x, **options), model, x
            except auditor.FormatLossError as exc:
                raise Findings(f"{spec}: {' '.join(str(exc).split())}") from exc

    def title(self, spec: str, dims: tuple[int, ...]) -> str:
        args = self.args
        where = f" {'fake ' if args.fake else ''}{self.device or 'cpu'}"
        return f"== {spec}  input {'x'.join(map(str, dims))} {args.dtype} {args.format}{where}" + (
            "" if not args.no_backward else "  (forward only)"
        )


def _writers(result: ModelAudit) -> dict[str, Callable[[Path], object]]:
    """Each file of one model's audit, named as in OUTPUT_FILES, and how to write it to a path."""
    from . import plot  # matplotlib: only when files are written

    audit, depth = result.audit, result.depth
    files = {
        "events.csv": audit.to_csv,
        "hotspots.csv": lambda p: audit.hotspots().to_csv(p, index=False),
        "causes.csv": lambda p: audit.causes().to_csv(p, index=False),
        "summary.csv": lambda p: audit.summary(depth or 1).to_csv(p, index=False),
        "coverage.csv": lambda p: audit.coverage().to_csv(p, index=False),
        "report.txt": lambda p: p.write_text(result.report + "\n"),
        # the temporary name does not end in .png, hence the explicit format
        "heatmap.png": lambda p: plot.save(plot.heatmap(audit, depth=depth), p, format="png"),
        "timeline.png": lambda p: plot.save(plot.format_timeline(audit, depth=depth), p, format="png"),
    }
    if result.fixes is not None:
        files["fixes.txt"] = lambda p: p.write_text(result.fixes + "\n")
    if result.suggested is not None:
        files["fixes.patch"] = lambda p: p.write_text(result.suggested.patch())
    if result.verified is not None:
        files["verify.csv"] = lambda p: result.verified.to_csv(p, index=False)
    if result.trace:
        files["trace.json"] = audit.export_chrome_trace
    if result.html and result.report is not None:
        files["report.html"] = lambda p: p.write_text(html_page(result))
    if audit.compiled is not None:
        files["conversions.csv"] = lambda p: audit.compiled.conversions().to_csv(p, index=False)
        files["graphs.csv"] = lambda p: audit.compiled.graphs().to_csv(p, index=False)
        files["compiled.csv"] = audit.compiled.to_csv
    return files


def html_page(result: ModelAudit) -> str:
    """``report.html``: the audit's HTML (measured savings first once verified) and, with
    --fix, the fixes' HTML, as one page a browser opens."""
    import html as html_escape

    top = result.top
    body = result.audit.html(top=top, depth=result.depth or 1, verification=result.verified)
    if result.suggested is not None:
        body += result.suggested._repr_html_()
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>format-audit</title>"
            "<style>body{font-family:sans-serif;font-size:14px;margin:1.5em;max-width:1400px}"
            "table{border-collapse:collapse;margin:0.6em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
            "vertical-align:top}caption{text-align:left;font-weight:bold}</style></head><body>"
            f"<h2>{html_escape.escape(result.title)}</h2>{body}</body></html>\n")


def write_outputs(result: ModelAudit, folder: Path) -> list[Path]:
    """Write the audit's files into ``folder``, each atomically, and remove those an earlier
    audit there (overwritten with ``--force``) had and this one has not, so the folder holds one
    audit. A file that cannot be written or removed is the user's ``--out`` at fault."""
    writers = _writers(result)
    for name in OUTPUT_FILES:
        path = folder / name
        try:
            if name in writers:
                atomic_write(path, writers[name])
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {folder}: cannot write {name} ({exc.strerror or exc})") from exc
    return [folder / name for name in OUTPUT_FILES if name in writers]


def report_failure(failure: BaseException, line: str, show_traceback: bool) -> None:
    """One line on stderr; first, when asked for, the traceback with the exception it wraps."""
    if show_traceback:
        traceback.print_exception(failure)
    sys.stderr.write(f"format-audit: {line}\n")


def main(argv: list[str] | None = None) -> int:
    """Run format-audit on ``argv`` and return its exit status (the parser's epilog lists them)."""
    args = parse(argv)
    return args if isinstance(args, int) else run_parsed(args)


def run_parsed(args) -> int:
    """Run a parsed command line and return its exit status; every failure is one line on stderr."""
    try:
        return run(args)
    except Failure as exc:
        report_failure(exc, f"{exc.heading}{exc}", args.traceback)
        status = exc.status
    except Interrupted as exc:  # after a model's step was recorded: its finished parts were written
        report_failure(exc, exc.line(), args.traceback)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt as exc:  # before a step was recorded: nothing of that model to keep
        report_failure(exc, "interrupted before the step was recorded: nothing of that model was written "
                            "(models finished before it are printed above)", args.traceback)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug in this file, outside every stage
        report_failure(exc, f"{InternalError.heading}{one_line(exc)}", args.traceback)
        status = EXIT_INTERNAL
    if status == EXIT_INTERNAL:
        sys.stderr.write(BUG_NOTE + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
