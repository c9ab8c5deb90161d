"""What the CLI-level run tests share: short real clips, the command, and reading records back
with plain readers (pyarrow and json, not the package's own)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

# Real test-other utterances whose first 2.5 s tiny.en decodes greedily (no temperature
# fallback). Sampled fallback windows are keyed per item and window, so they too resume
# identically (tests/engine/test_scheduler.py checks that); these clips keep the kill test fast.
CLIP_IDS = (
    "533-1066-0002", "533-1066-0008", "1688-142285-0004", "1998-15444-0000", "1998-15444-0006",
    "2033-164914-0002", "2609-156975-0000", "2609-156975-0006", "3005-163389-0002",
    "3005-163389-0008", "3080-5032-0004", "3331-159605-0000",
)
CLIP_SECONDS = 2.5
CORRUPT_ID = "corrupt-flac"  # an error record must be exactly-once too
RUN_TIMEOUT_S = 240


def write_clips(shared_data: Path, path: Path) -> Path:
    """A small Parquet (HF convention) of short FLAC clips cut from real LibriSpeech rows."""
    src = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    rows = {r["id"]: r for r in pq.read_table(src, columns=["id", "audio"]).to_pylist()}
    out: list[dict[str, Any]] = []
    for clip_id in CLIP_IDS:
        audio, rate = sf.read(io.BytesIO(rows[clip_id]["audio"]["bytes"]), dtype="float32")
        buf = io.BytesIO()
        sf.write(buf, audio[: int(CLIP_SECONDS * rate)], rate, format="FLAC")
        out.append({"id": clip_id, "audio": {"bytes": buf.getvalue(), "path": f"{clip_id}.flac"}})
    # Placed mid-input so it is committed between ok records.
    out.insert(5, {"id": CORRUPT_ID, "audio": {"bytes": b"fLaC" + bytes(200), "path": "bad.flac"}})
    pq.write_table(pa.Table.from_pylist(out), path)
    return path


def command(clips: Path, out: Path, cache: Path, fmt: str = "jsonl", shard_size: int = 2, workers: int = 0,
            *extra: str) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "batchscribe", "run", str(clips), "-o", str(out), "--model", "tiny.en",
            "--cache-dir", str(cache), "--device", "cpu", "--batch-size", "4", "--format", fmt,
            "--shard-size", str(shard_size), "--workers", str(workers), "--no-progress", "--no-report", *extra]


def shards(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("records-*") if p.suffix in (".jsonl", ".parquet"))


def read_committed(path: Path) -> list[dict[str, Any]]:
    """A committed shard read strictly: a torn line or footer fails the test."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path.name} does not end with a newline: torn write"
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def committed(out: Path) -> list[dict[str, Any]]:
    """Every record in `out`'s shard files (all writers), asserting no id is there twice."""
    if not out.exists():
        return []
    records = [r for p in shards(out) for r in read_committed(p)]
    counts = Counter(r["id"] for r in records)
    assert not [i for i, n in counts.items() if n > 1], f"ids committed twice: {counts.most_common(3)}"
    return records


def outcome(record: dict[str, Any]) -> str:
    return record["text"] if record.get("error") is None else f"ERROR {record['error']}"


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    # The whole group: the run and its decoder processes, as on a lost machine (or Slurm's SIGTERM).
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait()


def owner_pid(out: Path, prefix: str = "records") -> int | None:
    """The pid a live run wrote into its lock file (it does so right after taking the lock)."""
    try:
        return int(json.loads((out / f".batchscribe-{prefix}.lock").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None
