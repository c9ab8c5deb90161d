"""What each live writer of a folder is writing with, so that parts started together cannot mix
settings.

A run is checked against the run configs of writers that have committed records
(output/identity.py). Two `--shard-index` parts started at once (an array job) have none yet, so
before this each passed and a folder could end up holding records of two models. Now each live
writer leaves a claim, `.batchscribe-<prefix>.claim.json` (the settings that pin records), and a
new writer is compared with the claims of the writers alive beside it.

One short-lived lock, `.batchscribe-claims.lock` (exclusive, blocking: held for a few file reads),
orders the steps that matter: a writer takes its own lock and drops its old claim in one step
(`lock_output`), and compares and writes its claim in another (`claim_folder`). So a live
writer's claim file is either absent (it has not claimed yet: it will compare against the others
when it does) or its current one, never a claim left by an earlier run of the same part. A writer
is alive while it holds its lock; a dead writer's claim is ignored (flock locks die with their
process).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from batchscribe.output.identity import IDENTITY_KEYS, differences
from batchscribe.output.lock import CLAIM, claim_name, claims_locked, writer_alive
from batchscribe.output.resume import ResumeConflictError
from batchscribe.output.writers import write_json_atomic

_CLAIM = re.compile("^" + re.escape(CLAIM.format(prefix="@")).replace("@", "(?P<prefix>.+)") + "$")


def claim_folder(directory: Path, prefix: str, config: dict[str, Any], ignore: tuple[str, ...] = ()) -> None:
    """Compare this writer's settings (`config`: what its run config will pin) with every other
    live writer's claim, then leave its own; ResumeConflictError naming the differences."""
    directory = Path(directory)
    mine = {key: config.get(key) for key in IDENTITY_KEYS if key not in ignore}
    with claims_locked(directory):
        for path in sorted(directory.iterdir()):
            m = _CLAIM.match(path.name)
            if m is None or m.group("prefix") == prefix or not writer_alive(directory, m.group("prefix")):
                continue
            try:
                theirs = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a claim being replaced cannot be: claims are written under this lock
            diffs = [d for key in mine if key in theirs for d in differences(key, theirs[key], mine[key])]
            if diffs:
                part = m.group("prefix").removeprefix("records-").removeprefix("records")
                raise ResumeConflictError(
                    f"another batchscribe run is writing into {directory}{f' (part {part})' if part else ''} with "
                    "other settings:\n" + "\n".join(diffs) + "\nThe parts of one folder must share them, or its "
                    "records would mix. Give this part the 'before' values, or choose another --output."
                )
        write_json_atomic(directory / claim_name(prefix), {key: config.get(key) for key in IDENTITY_KEYS})
