"""`batchscribe export`: a run folder's committed records as srt / vtt / txt / tsv files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from batchscribe.cli.app import _die, app, err, out, warn_if_writing

ExportFormat = Literal["srt", "vtt", "txt", "tsv"]


@app.command("export", short_help="Write a run's records as srt/vtt/txt/tsv files, one per item.")
def export_command(
    run_dir: Annotated[Path, typer.Argument(metavar="OUT", help="A `batchscribe run` --output folder.",
                                            show_default=False)],
    fmt: Annotated[ExportFormat, typer.Option("--format", "-f", help="File format (openai-whisper's writers).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the files into.",
                                         show_default=False)],
) -> None:
    """One file per committed item of a run folder, named by its id (ids that are not safe file
    names get a hashed name). Error records are skipped and counted; rerunning rewrites nothing."""
    from batchscribe.output.export import ExportError, export_run

    warn_if_writing(run_dir)
    try:
        result = export_run(run_dir, fmt, output)
    except ExportError as exc:
        _die(str(exc), 2)
    except OSError as exc:  # a full disk or permissions mid-export: every file is whole, old or new
        _die(f"export to {output} failed ({exc}); files written so far are whole: free space or fix the "
             "permissions and rerun the same command", 1)
    for name in result.bad_shards:
        err.print(f"warning: {run_dir / name} does not verify and was skipped; rerun the `batchscribe run` "
                  "command to redo its items", highlight=False, soft_wrap=True)
    out.print(result.summary(), highlight=False, soft_wrap=True)
