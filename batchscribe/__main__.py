"""The `batchscribe` command's entry point: `python -m batchscribe` and the console script.

It imports the CLI itself, so that a Ctrl-C while Python loads it (a few tenths of a second before
any run starts) is a one-line message and exit 130, not a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from batchscribe.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted while starting: nothing was read or written; rerun the same command to resume\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
