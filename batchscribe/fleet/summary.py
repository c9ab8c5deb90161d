"""The one summary.json of a `--gpus` run, from its children's summaries (each child also keeps its
own, `summary-<prefix>.json`, as any writer does)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from batchscribe.audio.sources.fingerprint import canonical_input
from batchscribe.fleet.plan import ChildPlan
from batchscribe.output.records import now_iso
from batchscribe.output.writers import hostname, package_versions
from batchscribe.run import RunOptions
from batchscribe.sink import rtfx
from batchscribe.version import __version__


def fleet_summary(inputs: Sequence[str], opts: RunOptions, children: Sequence[tuple[ChildPlan, int, dict[str, Any] | None]],
                  before: dict[str, Any], status: str, wall: float, start_time: str,
                  first_record: float | None = None) -> dict[str, Any]:  # fmt: skip
    """`children`: (plan, restarts, that child's summary or None when it never got that far);
    `before`: the children's committed totals when the run began, so `this_run` is the difference;
    `first_record`: seconds after the run began when a child first reported a record."""
    summaries = [s for _, _, s in children if s]
    total = {k: sum(int(s.get(k, 0)) for s in summaries) for k in ("items", "ok", "errors", "shards")}
    audio_s = sum(float(s.get("audio_hours", 0.0)) for s in summaries) * 3600.0
    new_audio = max(0.0, audio_s - float(before["audio_seconds"]))
    load = max((float(s.get("model_load_seconds") or 0.0) for s in summaries), default=0.0)
    this = [s.get("this_run", {}) for s in summaries]
    first = summaries[0] if summaries else {}
    return {
        "batchscribe_version": __version__, "status": status, **total, "audio_hours": audio_s / 3600.0,
        # This run only: the folder's records now less those committed before it began (the
        # children's own this_run counts restart from zero with each restart).
        "this_run": {"items": max(0, total["items"] - int(before["items"])),
                     "ok": max(0, total["ok"] - int(before["ok"])),
                     "errors": max(0, total["errors"] - int(before["errors"])),
                     "skipped_completed": int(before["items"]),
                     "retried_errors": sum(int(t.get("retried_errors", 0)) for t in this),
                     "audio_hours": new_audio / 3600.0,
                     **({"nothing_left": True} if this and all(t.get("nothing_left") for t in this) else {})},
        "wall_seconds": wall,
        "rtfx": rtfx(new_audio, wall),
        # The children load their models at the same time: the longest load is the run's start-up.
        "model_load_seconds": load,
        "rtfx_excluding_model_load": rtfx(new_audio, wall - load),
        "first_record_seconds": first_record,
        "start_time": start_time, "end_time": now_iso(),
        "gpus": [{"device": p.device, "prefix": p.prefix, "restarts": restarts,
                  "status": (s or {}).get("status", "not started"), "items": (s or {}).get("items", 0)}
                 for p, restarts, s in children],
        "model": first.get("model", {"name": opts.model}), "engine": first.get("engine"),
        "options": {"engine": dataclasses.asdict(opts.engine), "format": opts.format, "workers": opts.workers,
                    "num_shards": opts.source.num_shards, "shard_index": opts.source.shard_index,
                    "children_num_shards": children[0][0].num_shards if children else None},
        "inputs": [canonical_input(i) for i in inputs],
        "hostname": hostname(),
        "packages": package_versions(),
    }  # fmt: skip
