"""Shard writers: records valid as OpenAI verbose_json, JSONL/Parquet round trips, atomic commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai.types.audio import TranscriptionVerbose

from batchscribe.output import writers
from batchscribe.output.writers import ShardWriter, read_shard, write_atomic


def ok_record(i: int) -> dict[str, Any]:
    # Shaped like a tiny.en result: timestamp tokens start at 50363 in that vocabulary.
    return {
        "id": f"utt-{i}",
        "text": " He was not an ill disposed young man.",
        "language": "english",
        "duration": 2.99,
        "segments": [
            {"id": 0, "seek": 0, "start": 0.0, "end": 2.5,
             "text": " He was not an ill disposed young man.",
             "tokens": [50363, 679, 373, 407, 281, 4171, 32668, 1862, 582, 13, 50488],
             "temperature": 0.0, "avg_logprob": -0.2345, "compression_ratio": 0.9,
             "no_speech_prob": 0.012},
        ],
        "reference": "he was not an ill disposed young man",
        "speaker_id": 7 + i,
        "tags": ["a", "b"],
    }


def error_record(i: int) -> dict[str, Any]:
    return {"id": f"bad-{i}", "error": f"bad-{i}: not audio; re-encode it", "duration": None,
            "reference": "x", "speaker_id": 3, "tags": []}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_and_openai_schema(tmp_path: Path, fmt: str) -> None:
    records = [ok_record(0), error_record(0), ok_record(1)]
    w = ShardWriter(tmp_path, fmt)
    for r in records:
        w.add(r)
    w.flush()
    assert w.committed == [f"records-00000.{fmt}"]
    back = read_shard(tmp_path / w.committed[0])
    assert back == records
    for r in back:
        if r.get("error") is None:
            TranscriptionVerbose.model_validate(r)  # the OpenAI SDK's verbose_json type
        else:
            assert "segments" not in r and r["duration"] is None


def test_jsonl_is_one_json_object_per_line(tmp_path: Path) -> None:
    rec = ok_record(0) | {"score": np.float32(0.5), "n": np.int64(3), "nan": float("nan"),
                          "text_ja": "日本語"}
    (tmp_path / "x.jsonl").write_bytes(writers.encode_jsonl([rec, error_record(1)]))
    lines = (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    finite = ok_record(2) | {"text_ja": "日本語", "pair": (1, 2.5)}  # encoded without the NaN walk: the same bytes
    assert writers.jsonl_line(finite) == json.dumps(writers._finite(finite), ensure_ascii=False)
    first = json.loads(lines[0])  # strict: NaN would not parse under allow_nan=False consumers
    assert first["score"] == 0.5 and first["n"] == 3 and first["nan"] is None
    assert first["text_ja"] == "日本語"
    json.loads(lines[1], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_parquet_schema_is_fixed_across_shards(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.dataset as ds

    w = ShardWriter(tmp_path, "parquet", shard_size=2)
    nulls = [{"id": f"n{i}", "error": "x", "duration": None, "speaker_id": None, "tags": None}
             for i in range(2)]
    for r in [ok_record(0), ok_record(1), error_record(0), error_record(1), *nulls]:
        w.add(r)
    w.flush()
    assert w.committed == [f"records-0000{i}.parquet" for i in range(3)]
    # All-error shards have null segments (and here null passthrough values) but the same types:
    # the three files read as one table.
    table = ds.dataset(tmp_path, format="parquet").to_table()
    assert table.num_rows == 6
    tags = table.schema.field("tags").type
    assert tags.value_type == pa.string() and pa.types.is_list(tags)
    seg = table.schema.field("segments").type
    assert seg.value_type.field("tokens").type.value_type == pa.int32()
    assert [f.name for f in seg.value_type] == list(writers.SEGMENT_FIELDS)


def test_parquet_loads_with_datasets(tmp_path: Path) -> None:
    import datasets

    w = ShardWriter(tmp_path, "parquet")
    for r in [ok_record(0), error_record(0)]:
        w.add(r)
    w.flush()
    d = datasets.load_dataset("parquet", data_files=str(tmp_path / "*.parquet"), split="train")
    assert d[0]["segments"][0]["tokens"][0] == 50363
    assert d[1]["error"].startswith("bad-0")


def test_shards_by_count_and_age(tmp_path: Path) -> None:
    now = [0.0]
    seen: list[tuple[str, int]] = []
    w = ShardWriter(tmp_path, "jsonl", shard_size=3, commit_seconds=10.0, clock=lambda: now[0],
                    on_commit=lambda name, recs: seen.append((name, len(recs))))
    for i in range(7):
        w.add(ok_record(i))
    assert seen == [("records-00000.jsonl", 3), ("records-00001.jsonl", 3)]
    assert w.pending == 1
    now[0] = 10.5  # the buffered record is now older than commit_seconds
    w.add(ok_record(7))
    assert seen[-1] == ("records-00002.jsonl", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "records-00000.jsonl", "records-00001.jsonl", "records-00002.jsonl"]


def test_failed_rename_leaves_nothing_and_keeps_records(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    w = ShardWriter(tmp_path, "jsonl")
    w.add(ok_record(0))

    def full_disk(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "replace", full_disk)
    with pytest.raises(OSError):
        w.flush()
    assert list(tmp_path.iterdir()) == []  # neither the shard nor its temp file
    assert w.pending == 1 and w.committed == []
    monkeypatch.undo()
    w.flush()  # the records were kept and commit once the disk has room
    assert read_shard(tmp_path / "records-00000.jsonl") == [ok_record(0)]


def test_kill_between_write_and_rename_leaves_no_readable_shard(tmp_path: Path) -> None:
    # A real crash: the process SIGKILLs itself after the temp file is written and fsynced,
    # just before the rename. Nothing it leaves may match an output name.
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from batchscribe.output import writers
        writers.os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
        w = writers.ShardWriter(Path({str(tmp_path)!r}), "jsonl")
        w.add({{"id": "a", "error": "x", "duration": None}})
        w.flush()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    names = [p.name for p in tmp_path.iterdir()]
    assert names == [".records-00000.jsonl.tmp"]
    assert list(tmp_path.glob("records-*.jsonl")) == [] and list(tmp_path.glob("*.jsonl")) == []
    from batchscribe.output.resume import open_output

    state = open_output(tmp_path, "jsonl")  # the next run removes the leftover
    assert state.completed == set() and list(tmp_path.iterdir()) == []


def test_write_atomic_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "summary.json"
    write_atomic(p, b"old")
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and [x.name for x in tmp_path.iterdir()] == ["summary.json"]


def test_summary_and_versions(tmp_path: Path) -> None:
    versions = writers.package_versions()
    import pyarrow
    import torch

    assert versions["torch"] == torch.__version__.split("+")[0] or versions["torch"] == torch.__version__
    assert versions["pyarrow"] == pyarrow.__version__
    path = writers.write_summary(tmp_path, {"items": 3, "rtfx": float("inf")})
    assert json.loads(path.read_text()) == {"items": 3, "rtfx": None}
    assert os.path.basename(path) == "summary.json"


def test_jsonl_encoded_on_arrival_equals_json_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are encoded as they are added (off the shard's commit), and the shard is exactly the
    json module's lines; a record that cannot be encoded is refused at add() and leaves the buffer
    as it was; a failed commit keeps records and lines together for the retry."""
    w = ShardWriter(tmp_path, "jsonl", shard_size=3)
    w.add(ok_record(0))
    with pytest.raises(TypeError, match="not JSON serialisable"):
        w.add({**ok_record(1), "extra": object()})
    assert w.pending == 1
    nan = {**ok_record(2), "duration": float("nan")}
    w.add(nan)
    monkeypatch.setattr(writers.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(OSError):
        w.add(ok_record(3))  # the third record commits the shard, which fails
    monkeypatch.undo()
    w.flush()
    expected = [ok_record(0), {**nan, "duration": None}, ok_record(3)]
    text = (tmp_path / "records-00000.jsonl").read_text(encoding="utf-8")
    assert text == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in expected)
