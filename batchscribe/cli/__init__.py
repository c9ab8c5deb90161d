"""The `batchscribe` command line (Typer + rich; the only package that imports them).

Exit codes: 0 done; 1 item errors exceeded --max-errors, or the run failed (disk full, ...);
2 usage errors (bad flag, missing input or column, unknown model, settings that conflict with an
existing output directory, an output directory another run is writing); 130 / 143 / 129 stopped by
SIGINT / SIGTERM / SIGHUP (what was done is committed; rerun to resume).
"""

from __future__ import annotations

# Importing a command module registers its commands on `app`, in this order in --help.
from batchscribe.cli import run_cmd  # noqa: F401  (isort: skip)
from batchscribe.cli import commands  # noqa: F401
from batchscribe.cli import export_cmd  # noqa: F401
from batchscribe.cli.app import _Bar, app, new_command, said_interrupted
from batchscribe.cli_text import demo_manifest

__all__ = ["app", "main", "demo_manifest", "optional_ray_address", "_Bar"]


def main() -> None:
    import sys

    new_command()
    try:
        app(args=optional_ray_address(sys.argv[1:]))
    except SystemExit as exc:
        if exc.code == 130:
            said_interrupted()
        raise


def optional_ray_address(args: list[str]) -> list[str]:
    """`--ray` with no value (last, or before another option) becomes `--ray local`: Typer has no
    options whose value is optional, and `--ray [ADDRESS]` is how Ray users spell it."""
    out: list[str] = []
    for k, arg in enumerate(args):
        out.append(arg)
        if arg == "--ray" and (k + 1 == len(args) or args[k + 1].startswith("-")):
            out.append("local")
    return out
