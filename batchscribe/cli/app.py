"""The `batchscribe` command line's app, console and error handling (the cli package is the only one
that imports Typer and rich).

Exit codes: 0 done; 1 item errors exceeded --max-errors, or the run failed (disk full, ...);
2 usage errors (bad flag, missing input or column, unknown model, settings that conflict with an
existing output directory, an output directory another run is writing); 130 / 143 / 129 stopped by
SIGINT / SIGTERM / SIGHUP (what was done is committed; rerun to resume).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)
from rich.table import Table

from batchscribe.audio.sources import SourceError
from batchscribe.cli_text import audio_length
from batchscribe.config import MODEL_ERROR_NAMES, ConfigError
from batchscribe.output.resume import OutputDirError, ResumeConflictError
from batchscribe.output.writers import ShardWriteError
from batchscribe.run import RunResult, TooManyErrors
from batchscribe.sink import RunProgress
from batchscribe.stops import Terminated
from batchscribe.version import __version__

app = typer.Typer(
    name="batchscribe",
    help="Offline batch transcription of whole speech datasets with Whisper-family models.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()


class _Notes(logging.Handler):
    """The package's log lines on stderr, each once a run: the sources' notes (e.g. which column
    became the reference) as `note:`, every module's warnings as `warning:`, the prefix the CLI's
    own warnings carry (without a handler, Python printed the bare message)."""

    def __init__(self, level: int = logging.INFO, below: int = logging.WARNING, prefix: str = "[dim]note:[/dim]") -> None:
        super().__init__(level)
        self.below, self.prefix = below, prefix
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self.below and (message := record.getMessage()) not in self.seen:
            self.seen.add(message)
            err.print(f"{self.prefix} {escape(message)}", highlight=False, soft_wrap=True)


def _show_version(value: bool) -> None:
    if value:
        out.print(f"batchscribe {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:  # fmt: skip
    sources, package = logging.getLogger("batchscribe.audio.sources"), logging.getLogger("batchscribe")
    sources.setLevel(logging.INFO)
    for logger in (sources, package):
        for handler in [h for h in logger.handlers if isinstance(h, _Notes)]:  # one per invocation (tests run many)
            logger.removeHandler(handler)
    sources.addHandler(_Notes())  # below WARNING: a warning goes on up to the package's handler
    package.addHandler(_Notes(logging.WARNING, logging.CRITICAL + 1, "[yellow]warning:[/yellow]"))


def warn_if_writing(folder: Path) -> None:
    """A reader of a run's folder (export, eval) says when a run is still writing into it: what
    it reads is what has been committed so far."""
    from batchscribe.output.lock import live_writers

    if folder.is_dir():
        for owner in live_writers(folder):
            err.print(f"[yellow]warning:[/yellow] a batchscribe run{owner} is still writing into {folder}: this reads "
                      "the records committed so far; run it again once that run has finished", highlight=False,
                      soft_wrap=True)  # fmt: skip


INTERRUPTED = "interrupted: the records finished so far are committed; rerun the same command to resume"
INTERRUPTED_STARTING = "interrupted while starting: nothing was read or written; rerun the same command to resume"
# How far this process's command got: whether it has begun its work (entered `_handled`) and
# whether an error was printed, for `said_interrupted`.
_reached = {"work": False, "said": False}


def _die(message: str, code: int) -> NoReturn:
    _say_error(message)
    raise typer.Exit(code)


def _say_error(message: str) -> None:
    # escape(): a message may quote names with brackets (batchscribe[gpu], file[1].flac).
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    _reached["said"] = True


def new_command() -> None:
    _reached.update(work=False, said=False)


def said_interrupted() -> None:
    """For an exit 130 that printed nothing: Typer makes a KeyboardInterrupt outside `_handled`
    (while it parses the arguments, ~0.1 s as it imports pydantic; or after a run's summary) exit
    130 silently. Say it once, as `_handled` would."""
    if not _reached["said"]:
        _say_error(INTERRUPTED if _reached["work"] else INTERRUPTED_STARTING)


@contextmanager
def _handled() -> Iterator[None]:
    """Turn the package's boundary errors into a message and an exit code, not a traceback."""
    _reached["work"] = True
    try:
        yield
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM/SIGHUP as Terminated: committed, summary written
        _die(INTERRUPTED, 128 + exc.signum if isinstance(exc, Terminated) else 130)
    except TooManyErrors as exc:
        _die(str(exc), 1)
    except (SourceError, ConfigError, ResumeConflictError, OutputDirError) as exc:
        _die(str(exc), 2)
    except ShardWriteError as exc:  # its message names the shard, its folder and the fix
        _die(str(exc), 1)
    except OSError as exc:  # disk full, permissions mid-run: committed shards stay valid
        _die(f"{exc}; records committed so far are kept and a rerun resumes after them", 1)
    except Exception as exc:
        if type(exc).__name__ in MODEL_ERROR_NAMES:
            _die(str(exc), 2)
        if type(exc).__name__ in ("FleetError", "RayRunError"):  # a --gpus child or Ray failed: imported lazily
            _die(str(exc), 1)
        raise


class _Bar:
    """A rich progress bar fed by run()'s progress callback (items, audio hours, RTFx, ETA)."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]transcribing"), BarColumn(),
            TextColumn("{task.fields[count]}"),  # "5/?" said nothing while the total was unknown
            TextColumn("{task.fields[audio]} audio"), TextColumn("RTFx {task.fields[rtfx]:.1f}"),  # after start-up
            TextColumn("[red]{task.fields[errors]} errors"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("run", total=None, count="0 items", audio=audio_length(0), rtfx=0.0,
                                           errors=0)  # fmt: skip
        self.started = False

    def __call__(self, p: RunProgress) -> None:
        if not self.started:  # started by the first record, so model-loading errors print cleanly
            self.progress.start()
            self.started = True
        count = f"{p.done} items" if p.total is None else f"{p.done}/{p.total}"
        self.progress.update(self.task, completed=p.done, total=p.total, count=count,
                             audio=audio_length(p.audio_seconds), rtfx=p.rtfx_after_startup, errors=p.errors)


def _print_summary(result: RunResult) -> None:
    s = result.summary
    table = Table(show_header=False, box=None, pad_edge=False)
    this = s["this_run"]
    rows = [
        ("output", str(result.output_dir)),
        ("records", f"{s['items']} ({s['ok']} ok, {s['errors']} errors) in {s['shards']} shard(s)"),
        ("this run", f"{this['items']} new, {this['skipped_completed']} already done"),
        ("audio", audio_length(s["audio_hours"] * 3600)),
        ("wall time", f"{s['wall_seconds']:.1f} s"),
        ("RTFx", f"{s['rtfx']:.1f}" if s["rtfx"] is not None else "-"),
    ]
    if s.get("model_load_seconds") and s.get("rtfx_excluding_model_load"):
        # On a short input the fixed start-up cost is most of the wall time: show both figures.
        rows[-2:] = [("wall time", f"{s['wall_seconds']:.1f} s, of which {s['model_load_seconds']:.1f} s start-up "
                      "(imports, model load, engine build)"),
                     ("RTFx", f"{s['rtfx']:.1f} ({s['rtfx_excluding_model_load']:.1f} after start-up)")]  # fmt: skip
    for k, v in rows:
        table.add_row(f"[bold]{k}[/bold]", v)
    err.print(table)
    if this.get("nothing_left"):
        err.print("nothing left to do: every item already has a committed record (the model was not loaded)")


def _prepare_report() -> None:
    """Start the server the report's scoring workers fork from now, beside the run: it imports
    the CLI and the scoring code once, in its own process, so after the run the workers start
    ready instead of each importing them (seconds of a large run's report). Each worker re-runs
    the `batchscribe` script as `__mp_main__`, which imports only batchscribe.__main__ (a
    "__main__" preload would do nothing: CPython never hands the server a main path).
    The decode processes of a CPU run fork from the same server (one a process), hence theirs."""
    from batchscribe.process_context import process_context

    process_context(["batchscribe.cli", "batchscribe.audio.worker", "batchscribe.eval.report"])


def _report_wer(output_dir: Path) -> None:
    """A WER report next to the records when they carry references (run --text-column)."""
    try:
        from batchscribe.eval.inputs import EvalInputError
        from batchscribe.eval.render import write_report
        from batchscribe.eval.report import evaluate
    except ImportError:
        return
    from batchscribe.output.lock import live_writers

    others = live_writers(output_dir)  # e.g. the other --shard-index parts, still running
    if others:  # their records are not all there: a report now would score part of the folder
        owners = "; ".join(o.strip(" ()") or "starting" for o in others)
        err.print(f"note: no WER report yet: {len(others)} other run(s) still writing into {output_dir} ({owners}); "
                  f"the last to finish writes it, or run `batchscribe eval {output_dir}` then", highlight=False,
                  markup=False, soft_wrap=True)  # fmt: skip
        return
    try:
        report = evaluate(output_dir)
        paths = write_report(report, output_dir / "eval")
    except KeyboardInterrupt:  # after the summary: every record is committed
        _die(f"interrupted while scoring: every record is committed; rerun the same command to resume (it "
             f"writes the WER report), or run `batchscribe eval {output_dir}`", 130)  # fmt: skip
    except EvalInputError:
        return  # no references in these records: nothing to score
    except OSError as exc:  # the records are committed: a report that cannot be written is a warning
        err.print(f"[yellow]warning:[/yellow] {escape(str(exc))}")
        return
    err.print(f"[bold]WER[/bold] {report.wer:.2%} over {len(report.items)} items "
              f"(english normaliser); report: {paths.get('md', output_dir / 'eval')}")
