"""Two small systems' run directories over five references, shared by the report, compare, render
and HTML tests."""

from __future__ import annotations

import json
from pathlib import Path

REFS = {
    "w1": "the cat sat on the mat",
    "w2": "a stitch in time saves nine",
    "w3": "all that glitters is not gold",
    "w4": "every cloud has a silver lining",
    "w5": "actions speak louder than words",
}
# A beats B on w1 and w2, B beats A on w3, they tie on w4 (same errors) and w5 (both perfect).
HYPS_A = {"w1": "the cat sat on the mat", "w2": "a stitch in time saves nine",
          "w3": "all that glitters is gold", "w4": "every cloud has silver lining",
          "w5": "actions speak louder than words"}
HYPS_B = {"w1": "the cat sat on a hat", "w2": "stitch in tine save nine",
          "w3": "all that glitters is not gold", "w4": "every cloud had a silver lining",
          "w5": "actions speak louder than words"}


def run_dir(root: Path, name: str, hyps: dict[str, str], extra: list[dict] | None = None) -> Path:
    """A run's output directory: one JSONL shard of `hyps` (plus `extra` records) and a summary.json."""
    out = root / name
    out.mkdir(parents=True)
    rows = [{"id": k, "text": v, "duration": 2.0 + len(v) / 10} for k, v in hyps.items()] + (extra or [])
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps({"model": f"model-{name}", "items": len(rows)}))
    return out


def write_refs(path: Path) -> Path:
    """REFS as an id/text JSONL file with a `book` group column (True for w1 and w2)."""
    path.write_text("".join(json.dumps({"id": k, "text": v, "book": k in ("w1", "w2")}) + "\n"
                            for k, v in REFS.items()))
    return path
