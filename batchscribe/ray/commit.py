"""The --ray driver's side of exactly-once: the records streaming back from the actors, checked
once against the folder, then committed by the one ShardWriter this process owns.

Nothing in the folder changes before the first record arrives: that record carries the engine's
resolved identity (dtype, kernels, the weights' sha256), checked against the folder's run config
as a plain run checks it after loading the model. Then the folder is repaired (or --overwrite's
deletion done, or --retry-errors' records taken out), the run config written and records
committed. An id committed already, or received twice (a task redone after its actor died), is
dropped: each id ends in exactly one record.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

from batchscribe.config import MODEL_ERROR_NAMES, ConfigError
from batchscribe.output.resume import ResumeConflictError, summary_name
from batchscribe.output.writers import write_summary
from batchscribe.run_folder import Folder, nothing_left, open_sink
from batchscribe.run_options import RunOptions, RunResult, TooManyErrors
from batchscribe.sink import CompletedFilter, ProgressCallback, Sink, run_summary

_USER_ERRORS = (*MODEL_ERROR_NAMES, "ConfigError", "LanguageError")
# The last line of a traceback that raised one of them: `package.module.Name: message` (to the end).
_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:" + "|".join(_USER_ERRORS) + r"): ", re.M)


class RayRunError(RuntimeError):
    """Ray failed the run (an actor kept dying, the cluster went away); committed records are kept."""


class Drive:
    """One --ray run's writer: `drive(rows)` commits the rows and returns the run's result."""

    def __init__(self, inputs: Sequence[str], opts: RunOptions, ray_info: dict[str, Any], folder: Folder,
                 start: tuple[float, str], progress: ProgressCallback | None, total: int | None,
                 skipped: int) -> None:  # fmt: skip
        self.inputs, self.opts, self.ray_info, self.folder = list(inputs), opts, ray_info, folder
        self.state, self.output_dir = folder.state, folder.state.directory
        (self.start_wall, self.start_time), self.progress, self.total = start, progress, total
        self.skipped = skipped
        self.sink: Sink | None = None
        self.described: dict[str, Any] = {}
        self.received: set[str] = set()
        self.dropped = 0  # rows sent twice by a redone task

    def drive(self, rows: Iterator[dict[str, Any]]) -> RunResult:
        status = "interrupted"
        try:
            for row in rows:
                self._add(row)
                if self.sink is not None and self.sink.stop:
                    break
            if self.sink is not None:
                self.sink.flush()  # the last shard: a commit that fails here is summarised as one mid-run is
            status = "stopped: too many errors" if self.sink is not None and self.sink.stop else "complete"
        except BaseException as exc:
            if self.sink is not None:
                try:
                    self.sink.flush()  # finished records are valid whatever stopped the run
                finally:
                    self._write_summary(status)
            raise _user_error(exc) or exc
        if self.sink is None:  # no row came back: every item was done already
            return nothing_left(self.state, self.opts, self.skipped, self.start_wall, self.start_time)
        summary = self._write_summary(status)
        if self.sink.stop:
            raise TooManyErrors(f"{self.sink.total_errors} item errors exceed --max-errors {self.opts.max_errors}; "
                                f"the run stopped after committing {summary['items']} records to {self.output_dir}. "
                                "Fix those inputs, then rerun with --retry-errors.")  # fmt: skip
        return RunResult(self.output_dir, summary, tuple(self.sink.writer.committed))

    def _add(self, row: dict[str, Any]) -> None:
        if self.sink is None:
            self._begin(json.loads(row["describe"]))
        assert self.sink is not None
        item_id = str(row["id"])
        if item_id in self.received or item_id in self.sink.state.completed:
            self.dropped += 1
            return
        self.received.add(item_id)
        self.sink.add(json.loads(row["record"]))

    def _begin(self, described: dict[str, Any]) -> None:
        """The first record: the identity check, then the folder's first changes, then the writer."""
        self.described = described
        # Model loading happened in the actors, overlapped with reading and decoding: the time to the
        # first record is this run's start-up.
        self.sink = open_sink(self.folder, self.opts, described, self.start_wall, self.total, self.progress,
                              time.monotonic() - self.start_wall, CompletedFilter(self.state, self.skipped))  # fmt: skip

    def _write_summary(self, status: str) -> dict[str, Any]:
        assert self.sink is not None
        summary = run_summary(self.inputs, self.opts, self.state, self.sink, self.described, self.start_time,
                              status)  # fmt: skip
        summary["ray"] = {**self.ray_info, "rows_sent_twice": self.dropped}
        write_summary(self.output_dir, summary, summary_name(self.state.prefix))
        return summary


def _user_error(exc: BaseException) -> BaseException | None:
    """A Ray error whose cause is the user's (an unknown model, a bad option, in an actor's
    constructor) as that error, so the CLI says it plainly (exit 2); other Ray failures as
    RayRunError (exit 1). None: not Ray's (ours, or an interrupt): raised as it is."""
    if isinstance(exc, (KeyboardInterrupt, ResumeConflictError, ConfigError, TooManyErrors, OSError)):
        return None
    if not type(exc).__module__.startswith("ray"):
        return None
    if getattr(exc, "actor_init_failed", False):
        # An actor's constructor raised (an unknown model on a remote cluster's node): Ray keeps
        # only the traceback's text (ActorDiedError holds no cause), so its last line is read.
        text = str(exc)
        found = list(_RAISED.finditer(text))
        if found:
            return ConfigError(text[found[-1].end() :].strip())
    cause = getattr(exc, "cause", None)
    while cause is not None and type(cause).__module__.startswith("ray") and getattr(cause, "cause", None):
        cause = cause.cause
    if cause is not None and type(cause).__name__ in _USER_ERRORS:
        return cause
    return RayRunError(f"Ray Data failed the run ({type(exc).__name__}: {str(exc)[:2000]}); the records committed "
                       "so far are kept. Fix the cause and rerun the same command to resume.")
