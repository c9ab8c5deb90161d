"""Exactly-once under SIGKILL: `batchscribe run` killed at random moments, resumed, compared.

Each seed runs one output directory through a chain of killed runs (the whole process group is
SIGKILLed, as the OOM killer or a lost machine would) and a final run that completes. The kill
moments are random: after a random number of newly committed shards (0 means during start-up or
model loading) plus a random delay, so kills land before, between and during shard commits.
Between runs the shard size and the decoder pool (in-process or a worker process) change, which a
resume allows. The reference is an uninterrupted run of the same command with the real tiny.en.
A run that completes before its kill moment (a fast machine) ends its chain, which is checked like
a final run, and a new chain starts in a fresh directory: every seed delivers its five kills.

Checked after every kill: every committed shard parses completely and no id is committed twice.
Checked at the end: exactly one record per input id, texts identical to the reference, no temp
file left, the manifest lists exactly the shards on disk, and summary.json counts every item.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
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
SEEDS = (0, 1, 2, 3)
KILLS_PER_SEED = 5  # 20 kills in all
RUN_TIMEOUT_S = 240
RATE_16K = 16000


@pytest.fixture(scope="module")
def clips(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    path = tmp_path_factory.mktemp("kill") / "clips.parquet"
    pq.write_table(pa.Table.from_pylist(out), path)
    return path


def _command(clips: Path, out: Path, cache: Path, fmt: str, shard_size: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "batchscribe", "run", str(clips), "-o", str(out), "--model", "tiny.en",
            "--cache-dir", str(cache), "--device", "cpu", "--batch-size", "4", "--format", fmt,
            "--shard-size", str(shard_size), "--workers", str(workers), "--no-progress", "--no-report"]


def _shards(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("records-*") if p.suffix in (".jsonl", ".parquet"))


def _read_committed(path: Path) -> list[dict[str, Any]]:
    """A committed shard read strictly: a torn line or footer fails the test."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path.name} does not end with a newline: torn write"
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def _committed(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    records = [r for p in _shards(out) for r in _read_committed(p)]
    counts = Counter(r["id"] for r in records)
    assert not [i for i, n in counts.items() if n > 1], f"ids committed twice: {counts.most_common(3)}"
    return records


def _outcome(record: dict[str, Any]) -> str:
    return record["text"] if record.get("error") is None else f"ERROR {record['error']}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The whole group: the run and its decoder processes die together, as on a lost machine.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _kill_at_random_moment(cmd: list[str], out: Path, rng: random.Random) -> bool:
    """Start `cmd`, wait for 0-2 new shards plus 0-1 s, SIGKILL it. False if it finished first."""
    before = len(_shards(out)) if out.exists() else 0
    wait_shards = rng.choice((0, 1, 1, 2))
    delay = rng.uniform(0.0, 1.0)
    log = out.parent / f"{out.name}.stderr"
    with open(log, "wb") as err:  # a file, not a pipe: a full pipe could stall the run
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if out.exists() and len(_shards(out)) >= before + wait_shards:
                break
            time.sleep(0.02)
        time.sleep(delay)
        finished = proc.poll() is not None
    finally:
        _kill_group(proc)
    if finished:
        assert proc.returncode == 0, log.read_text(errors="replace")
    return not finished


def _check_complete(out: Path, reference: dict[str, str]) -> None:
    records = _committed(out)
    assert sorted(r["id"] for r in records) == sorted(reference)  # exactly once
    assert {r["id"]: _outcome(r) for r in records} == reference
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    manifest = [json.loads(line) for line in (out / "_manifest.ndjson").read_text().splitlines()]
    assert sorted(e["shard"] for e in manifest) == [p.name for p in _shards(out)]
    assert sorted(i for e in manifest for i in e["ids"]) == sorted(reference)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items"], summary["errors"]) == ("complete", len(reference), 1)


@pytest.fixture(scope="module")
def reference(clips: Path, tiny_en_dir: Path, model_cache: Path,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    proc = subprocess.run(_command(clips, out, model_cache, "jsonl", 4, 0), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    records = _committed(out)
    assert sorted(r["id"] for r in records) == sorted((*CLIP_IDS, CORRUPT_ID))
    greedy = [r["id"] for r in records for s in r.get("segments") or [] if s["temperature"] != 0.0]
    assert not greedy, f"temperature fallback on {greedy}: their text would depend on batching"
    return {r["id"]: _outcome(r) for r in records}


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_random_moments_then_resume_is_exactly_once(
    seed: int, clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(seed)
    fmt = "parquet" if seed == 3 else "jsonl"
    chain = 0
    out = tmp_path / f"out{chain}"
    kills, segments, progress = 0, 0, []
    started = time.monotonic()
    while kills < KILLS_PER_SEED:
        segments += 1
        assert segments <= 3 * KILLS_PER_SEED, "runs keep finishing before their kill moment"
        cmd = _command(clips, out, model_cache, fmt, rng.choice((1, 2)), rng.choice((0, 0, 1)))
        killed = _kill_at_random_moment(cmd, out, rng)
        done = _committed(out)  # after every kill: whole shards only, no id twice
        progress.append(len(done) if killed else "done")
        assert {r["id"] for r in done} <= set(reference)
        for r in done:
            assert _outcome(r) == reference[r["id"]], r["id"]
        if killed:
            kills += 1
        else:  # a fast machine finished the input first: check this chain, start another
            _check_complete(out, reference)
            chain += 1
            out = tmp_path / f"out{chain}"
    print(f"seed {seed}: {kills} kills in {time.monotonic() - started:.0f} s; records committed "
          f"at each kill: {progress}")

    final = subprocess.run(_command(clips, out, model_cache, fmt, 2, 0), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert final.returncode == 0, final.stderr
    _check_complete(out, reference)


def test_kill_during_model_conversion_then_rerun(tiny_en_dir: Path, tmp_path: Path) -> None:
    """SIGKILL on first use, after model.safetensors is written and before the folder is complete."""
    import numpy as np

    clip = tmp_path / "silence.wav"
    sf.write(clip, np.zeros(RATE_16K, np.int16), RATE_16K, subtype="PCM_16")
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ["run", str(clip), "-o", str(out), "--model", "tiny.en", "--cache-dir", str(cache), "--device", "cpu",
            "--workers", "0", "--no-progress", "--no-report"]
    script = (
        "import os, signal, sys\n"
        "from batchscribe.weights import ct2_convert\n"
        "ct2_convert._write_json = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from batchscribe.cli import app\n"
        f"sys.argv = ['batchscribe', *{args!r}]\n"
        "app()\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=RUN_TIMEOUT_S)
    assert killed.returncode == -signal.SIGKILL
    assert not (cache / "converted" / "tiny.en").exists()  # only a hidden temp folder is left
    assert not out.exists() or not list(out.glob("records-*"))
    proc = subprocess.run([sys.executable, "-m", "batchscribe", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in _committed(out)] == ["silence"]
    assert not list((cache / "converted").glob(".tiny.en.tmp-*"))  # the killed run's temp is reclaimed
    converted = cache / "converted" / "tiny.en"
    assert (converted / "model.safetensors").stat().st_size == (tiny_en_dir / "model.safetensors").stat().st_size
