"""A writer's output folder through a run: checked against the run before the model loads
(nothing in it changed), then, once the engine is known, prepared (repairs, --overwrite's
deletion, --retry-errors) and opened for records; or, when every item is done already, tidied and
summarised without loading a model. A plain run, a --gpus child and the --ray driver all go this
way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscribe.output.claims import claim_engine, claim_folder
from batchscribe.output.identity import check_engine_identity, check_id_scheme, check_run_config, write_run_config
from batchscribe.output.lock import OutputLock
from batchscribe.output.resume import OutputState, inspect_output, remove_records, repair_output, summary_name
from batchscribe.output.retry import retry_errors
from batchscribe.output.writers import ShardWriter, write_summary
from batchscribe.run_options import RunOptions, RunResult, TooManyErrors
from batchscribe.sink import CompletedFilter, ProgressCallback, Sink, nothing_left_summary


def nothing_left(state: OutputState, opts: RunOptions, skipped: int, start_wall: float,
                  start_time: str) -> RunResult:  # fmt: skip
    """Every item already has a committed record: the folder is tidied and its summary rewritten,
    and the model is never loaded (a plain rerun past --max-errors still stops, as any rerun does)."""
    repair_output(state)
    path = state.directory / summary_name(state.prefix)
    try:
        previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError:
        previous = {}  # a torn summary from a killed run: rewritten from the records
    summary = nothing_left_summary(state, previous, skipped, start_wall, start_time)
    write_summary(state.directory, summary, summary_name(state.prefix))
    if opts.max_errors is not None and summary["errors"] > opts.max_errors:
        raise TooManyErrors(
            f"{summary['errors']} item errors exceed --max-errors {opts.max_errors} in {state.directory}; "
            "fix those inputs, then rerun with --retry-errors to transcribe them again."
        )
    return RunResult(state.directory, summary, ())


def checked_state(output_dir: Path, prefix: str, config: dict[str, Any], opts: RunOptions,
                   lock: OutputLock, listing: dict[str, str]) -> OutputState:  # fmt: skip
    """What the writer's folder holds, checked against this run and against the other writers
    alive beside it (their claims, output/claims.py); changes nothing but this writer's claim."""
    # Repaired inputs change the fingerprint: --retry-errors is for exactly that.
    ignore = ("inputs_fingerprint",) if opts.retry_errors else ()
    if opts.overwrite:
        lock.exclusive_folder()  # refused now, not after the model loads, if another writer is live
        state = OutputState(output_dir, prefix, opts.format)
    else:
        state = inspect_output(output_dir, opts.format, prefix)
        check_run_config(output_dir, config, ignore=ignore, listing=listing)
        check_id_scheme(output_dir, state.completed)
    claim_folder(output_dir, prefix, config, ignore)
    return state


@dataclass(frozen=True)
class Folder:
    """A writer's output folder once checked against the run (`checked_state`), before anything
    in it changes: the writer's state, its lock, and the run config to write."""

    state: OutputState
    lock: OutputLock
    config: dict[str, Any]  # run_config(...): what pins the folder's records
    listing: dict[str, str]  # fingerprint.inputs_listing of the inputs


def open_sink(folder: Folder, opts: RunOptions, described: dict[str, Any], start_wall: float, total: int | None,
              progress: ProgressCallback | None, load_seconds: float, skip: CompletedFilter) -> Sink:  # fmt: skip
    """The engine is known (`described`: a transcriber's describe()): check its identity against
    the folder, then make the folder's first changes (repairs, --overwrite's deletion,
    --retry-errors), write the run config and open the shard writer. Every writer (a plain run, a
    --gpus child, the --ray driver) starts its records here."""
    state = folder.state
    if not opts.overwrite:
        check_engine_identity(state.directory, described.get("identity"))
    claim_engine(state.directory, state.prefix, described.get("identity"))
    # Every check has passed: from here on the folder is changed.
    retried = prepare_folder(state, opts, folder.lock)
    write_run_config(state.directory, {**folder.config, "engine": described.get("identity"),
                                       "model_info": described.get("model")}, state.prefix, folder.listing)  # fmt: skip
    writer = ShardWriter(state.directory, opts.format, state.prefix, state.next_index, opts.shard_size,
                         opts.commit_seconds, on_commit=state.on_commit, words=opts.decode.word_timestamps)  # fmt: skip
    return Sink(writer, state, opts.max_errors, start_wall, total, progress, load_seconds, retried, skip)


def prepare_folder(state: OutputState, opts: RunOptions, lock: OutputLock) -> list[dict[str, Any]]:
    """The first changes to the folder: --overwrite's deletion, or repairs and --retry-errors.
    Returns the error records taken out to be redone."""
    if opts.overwrite:
        try:
            remove_records(state.directory, state.prefix)
        finally:
            lock.share_folder()
        return []
    repair_output(state)
    return retry_errors(state) if opts.retry_errors else []
