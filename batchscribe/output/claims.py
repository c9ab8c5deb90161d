"""What each live writer of a folder is writing with, so that parts started together cannot mix
settings.

A run is checked against the run configs of writers that have committed records
(output/identity.py). Two `--shard-index` parts started at once (an array job) have none yet, so
each would pass and a folder could end up holding records of two models. So each live
writer leaves a claim, `.batchscribe-<prefix>.claim.json` (the settings that pin records), and a
new writer is compared with the claims of the writers alive beside it.

One short-lived lock, `.batchscribe-claims.lock` (exclusive, blocking: held for a few file reads),
orders the steps that matter: a writer takes its own lock and drops its old claim in one step
(`lock_output`), and compares and writes its claim in another (`claim_folder`). So a live
writer's claim file is either absent (it has not claimed yet: it will compare against the others
when it does) or its current one, never a claim left by an earlier run of the same part. A writer
is alive while it holds its lock; a dead writer's claim is ignored (flock locks die with their
process). Once its model has loaded, a writer adds its engine's identity (dtype, kernels, the
weights' hash) to its claim the same way (`claim_engine`): parts on other kinds of GPU may resolve
other kernels.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from batchscribe.output.identity import ENGINE_KEY, IDENTITY_KEYS, differences
from batchscribe.output.lock import CLAIM, claim_name, claims_locked, writer_alive
from batchscribe.output.resume import ResumeConflictError
from batchscribe.output.writers import write_json_atomic

_CLAIM = re.compile("^" + re.escape(CLAIM.format(prefix="@")).replace("@", "(?P<prefix>.+)") + "$")


def claim_folder(directory: Path, prefix: str, config: dict[str, Any], ignore: tuple[str, ...] = ()) -> None:
    """Compare this writer's settings (`config`: what its run config will pin) with every other
    live writer's claim, then leave its own; ResumeConflictError naming the differences."""
    mine = {key: config.get(key) for key in IDENTITY_KEYS if key not in ignore}
    with claims_locked(directory):
        _compare(Path(directory), prefix, mine)
        write_json_atomic(Path(directory) / claim_name(prefix), {key: config.get(key) for key in IDENTITY_KEYS})


def claim_engine(directory: Path, prefix: str, identity: Any) -> None:
    """Once the model has loaded: the engine's identity (dtype, kernels, the weights' hash) against
    the live writers' that have one (parts on other GPUs may resolve other kernels), then added to
    this writer's claim."""
    directory = Path(directory)
    with claims_locked(directory):
        _compare(directory, prefix, {ENGINE_KEY: identity})
        path = directory / claim_name(prefix)
        write_json_atomic(path, {**_read(path), ENGINE_KEY: identity})


def _compare(directory: Path, prefix: str, mine: dict[str, Any]) -> None:
    for path in sorted(directory.iterdir()):
        m = _CLAIM.match(path.name)
        if m is None or m.group("prefix") == prefix or not writer_alive(directory, m.group("prefix")):
            continue
        theirs = _read(path)
        diffs = [d for key in mine if key in theirs for d in differences(key, theirs[key], mine[key])]
        if diffs:
            part = m.group("prefix").removeprefix("records-").removeprefix("records")
            raise ResumeConflictError(
                f"another batchscribe run is writing into {directory}{f' (shard {part})' if part else ''} with "
                "other settings:\n" + "\n".join(diffs) + "\nThe parts of one folder must share them, or its "
                "records would mix. Give this part the 'before' values, or choose another --output."
            )


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none (a writer that has not claimed yet); claims are written whole, under the lock
