"""Shard formats: records valid as OpenAI verbose_json, JSONL/Parquet round trips, strict JSON lines,
one Parquet schema across shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscribe.output import formats
from batchscribe.output.formats import read_shard
from batchscribe.output.writers import ShardWriter
from tests.output.sample_records import error_record, ok_record


def _openai_verbose():
    """The OpenAI SDK's verbose_json type; only the tests that validate against it skip without the SDK
    (the GPU image has none), not the whole module's round trips."""
    return pytest.importorskip("openai.types.audio").TranscriptionVerbose


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
            _openai_verbose().model_validate(r)  # the OpenAI SDK's verbose_json type
        else:
            assert "segments" not in r and r["duration"] is None


def test_jsonl_is_one_json_object_per_line(tmp_path: Path) -> None:
    rec = ok_record(0) | {"score": np.float32(0.5), "n": np.int64(3), "nan": float("nan"),
                          "text_ja": "日本語"}
    (tmp_path / "x.jsonl").write_bytes(formats.encode_jsonl([rec, error_record(1)]))
    lines = (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    finite = ok_record(2) | {"text_ja": "日本語", "pair": (1, 2.5)}
    assert json.loads(formats.jsonl_line(finite)) == json.loads(json.dumps(finite, ensure_ascii=False))
    assert "\n" not in formats.jsonl_line(finite) and "日本語" in formats.jsonl_line(finite)  # UTF-8, not \u escapes
    first = json.loads(lines[0])  # strict: NaN would not parse under allow_nan=False consumers
    assert first["score"] == 0.5 and first["n"] == 3 and first["nan"] is None
    assert first["text_ja"] == "日本語"
    json.loads(lines[1], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63), 2**63 - 1), st.text())
def test_jsonl_values_equal_the_json_modules(x: float, n: int, text: str) -> None:
    """orjson's line reads back as the json module's does: every finite float exactly, NaN and
    infinity as null, integers and any text (the json module is the reference)."""
    record = {"id": text, "x": x, "n": n, "words": [{"word": text, "start": x, "end": x}]}
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no UTF-8 line can hold them, with either encoder
        with pytest.raises(UnicodeEncodeError):
            formats.jsonl_line(record)
        return
    expected = json.loads(json.dumps(formats._finite(record), ensure_ascii=False))
    assert json.loads(formats.jsonl_line(record)) == expected


def test_jsonl_takes_what_orjson_refuses_the_json_modules_way() -> None:
    """Passthrough values orjson writes differently or refuses: dates as isoformat, bytes and paths
    through `_json_default`, integer dict keys and integers past 64 bits as the json module writes
    them; a type nobody can write raises the same TypeError."""
    import dataclasses
    from datetime import date, datetime

    record = {"id": "a", "when": datetime(2026, 12, 5, 1, 2, 3), "day": date(2026, 12, 5), "blob": b"xyz",
              "path": Path("a/b.flac"), "big": 2**70, "by_year": {2024: "x"}, "f16": np.float16(0.5)}
    back = json.loads(formats.jsonl_line(record))
    assert back == {"id": "a", "when": "2026-12-05T01:02:03", "day": "2026-12-05", "blob": "<3 bytes>",
                    "path": "a/b.flac", "big": 2**70, "by_year": {"2024": "x"}, "f16": 0.5}

    @dataclasses.dataclass
    class Opaque:
        x: int

    with pytest.raises(TypeError, match="Opaque is not JSON serialisable"):
        formats.jsonl_line({"id": "b", "o": Opaque(1)})


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
    assert [f.name for f in seg.value_type] == list(formats.SEGMENT_FIELDS)


def test_parquet_loads_with_datasets(tmp_path: Path) -> None:
    import datasets

    w = ShardWriter(tmp_path, "parquet")
    for r in [ok_record(0), error_record(0)]:
        w.add(r)
    w.flush()
    d = datasets.load_dataset("parquet", data_files=str(tmp_path / "*.parquet"), split="train")
    assert d[0]["segments"][0]["tokens"][0] == 50363
    assert d[1]["error"].startswith("bad-0")


def _with_words(record: dict) -> dict:
    words = [{"word": " He", "start": 0.0, "end": 0.3, "probability": 0.9},
             {"word": " was", "start": 0.3, "end": 0.62, "probability": 0.75}]
    seg = {**record["segments"][0], "words": words}
    return {**record, "segments": [seg], "words": [{k: w[k] for k in ("word", "start", "end")} for w in words]}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_word_timestamps_round_trip(tmp_path: Path, fmt: str) -> None:
    """Records with words (a --word-timestamps run) read back as written and validate as the SDK's
    type; Parquet shards of such a run share the words columns, an all-error shard included."""
    import pyarrow.dataset as ds

    records = [_with_words(ok_record(0)), error_record(0), error_record(1)]
    w = ShardWriter(tmp_path, fmt, shard_size=1 if fmt == "parquet" else 10, words=True)
    for r in records:
        w.add(r)
    w.flush()
    back = [r for name in w.committed for r in read_shard(tmp_path / name)]
    assert back == records
    _openai_verbose().model_validate(back[0])
    if fmt == "parquet":
        import pyarrow.parquet as pq

        schemas = [pq.read_schema(tmp_path / name) for name in w.committed]
        assert len(schemas) == 3 and all(s.equals(schemas[0]) for s in schemas)  # error-only shards too
        schema = ds.dataset(tmp_path, format="parquet").schema
        assert {f.name for f in schema.field("words").type.value_type} == {"word", "start", "end"}
        assert "words" in [f.name for f in schema.field("segments").type.value_type]
