"""What one child of a `--gpus` run executes: `python -m batchscribe.fleet.child`.

The parent writes the job (inputs, output folder, RunOptions; fleet/wire.py) to the child's stdin
as one JSON line and keeps the pipe open; the child runs the plain `run()` and reports on its stdout, one JSON object a line:
`{"progress": RunProgress fields}`, then `{"summary": ...}`, or `{"error": message}`. Everything
else the child would print goes to stderr, so no stray print can corrupt that stream.

The child exits as the CLI does (0, 1, 2, 130, 143). When its stdin reaches end of file the parent
is gone (even SIGKILLed): the child then stops itself as on SIGTERM, committing what it finished,
so no orphan keeps holding its writer lock and a rerun can resume at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from typing import IO, Any

from batchscribe.audio.sources import SourceError
from batchscribe.config import MODEL_ERROR_NAMES, ConfigError
from batchscribe.fleet.plan import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE
from batchscribe.fleet.wire import decode_job
from batchscribe.output.resume import OutputDirError, ResumeConflictError
from batchscribe.run import TooManyErrors, run
from batchscribe.sink import RunProgress
from batchscribe.stops import Terminated

_USAGE_ERRORS = (SourceError, ConfigError, ResumeConflictError, OutputDirError)


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, default=str) + "\n")
    channel.flush()


def _watch_parent(stdin: IO[bytes]) -> None:
    """End of stdin: the parent has died; stop as SIGTERM would (committed records kept)."""
    stdin.read()
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT
    if isinstance(exc, _USAGE_ERRORS) or type(exc).__name__ in MODEL_ERROR_NAMES:
        return EXIT_USAGE
    return EXIT_FAILED  # TooManyErrors, a full disk, a bug: the parent does not restart these


def main() -> int:
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # stray prints (a library's) go to stderr, never into the message stream
    # The parent stops its children with SIGTERM; a Ctrl-C at the terminal reaches only the parent
    # (children run in their own session), which forwards it once.
    inputs, output_dir, opts = decode_job(sys.stdin.buffer.readline())
    threading.Thread(target=_watch_parent, args=(sys.stdin.buffer,), daemon=True).start()

    def progress(p: RunProgress) -> None:
        _send(channel, {"progress": dataclasses.asdict(p)})

    try:
        result = run(inputs, output_dir, opts, progress=progress)
    except BaseException as exc:  # noqa: BLE001 -- every outcome becomes an exit code and a message
        code = _exit_code(exc)
        if code == EXIT_FAILED and not isinstance(exc, (TooManyErrors, OSError)):
            import traceback

            traceback.print_exc()  # a bug: its traceback in the child's stderr, which the parent shows
        _send(channel, {"error": str(exc) or type(exc).__name__, "code": code})
        return code
    _send(channel, {"summary": result.summary})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # NOTE: os._exit, not sys.exit: the parent-watching thread is blocked reading stdin, and an
    # interpreter shutting down with a daemon thread inside a buffered read aborts (a fatal error
    # and another exit code). Everything the run wrote is already fsynced and closed.
    os._exit(code)
