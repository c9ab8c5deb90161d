"""Fuzzing (hypothesis) of audio decoding, the decode pool, record writing and a whole run.

Properties: decoding either returns finite mono float32 samples or raises AudioDecodeError (never
anything else); the pool yields exactly one DecodedItem per item, in order, with audio xor error;
any record a run can produce (odd ids, unicode, non-finite numbers, nested passthrough values) is
committed as a shard that standard readers parse back to the same ids; a run over random rows
writes exactly one record per id. Example counts are bounded so the file runs in well under 60 s.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscribe.audio.decode import AudioDecodeError, decode_audio
from batchscribe.audio.pool import decode_stream
from batchscribe.audio.sources import SourceItem, SourceOptions
from batchscribe.output.writers import ShardWriter
from batchscribe.run import RunOptions, run

RATE = 16000
DEMO_CLIP = (Path(__file__).resolve().parents[2] / "batchscribe" / "demo"
             / "sense_and_sensibility_01_austen_64kb-0870.flac")
FAST = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _encoded(fmt: str, subtype: str, seconds: float = 0.2, rate: int = RATE, channels: int = 1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.repeat(x[:, None], channels, axis=1), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


SEEDS = {
    "wav16": _encoded("WAV", "PCM_16"),
    "wavfloat": _encoded("WAV", "FLOAT", rate=22050, channels=2),
    "flac": _encoded("FLAC", "PCM_16"),
    "ogg": _encoded("OGG", "VORBIS", seconds=0.3),
}


def _check_decoded(data: bytes) -> None:
    try:
        audio = decode_audio(data)
    except AudioDecodeError as exc:
        assert str(exc) and "\n" not in str(exc).strip()  # one-line message for the record
        return
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0
    assert np.isfinite(audio).all()


@FAST
@given(st.binary(max_size=4096))
def test_random_bytes_decode_or_raise_audio_decode_error(data: bytes) -> None:
    _check_decoded(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real encoded file with header bytes overwritten, a tail cut off, or bytes spliced in."""
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.integers(0, min(len(data) - 1, draw(st.sampled_from([64, 256, len(data) - 1])))))
        data[where] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(max_size=64))
    return bytes(data)


@FAST
@given(mutated())
def test_mutated_real_headers_decode_or_raise_audio_decode_error(data: bytes) -> None:
    _check_decoded(data)


# ---------------------------------------------------------------------------------------- pool

audio_cells = st.one_of(
    st.binary(max_size=512),
    mutated(),
    st.sampled_from(sorted(SEEDS.values())),
    st.none(),
)


@settings(deadline=None, max_examples=40)
@given(st.lists(audio_cells, max_size=8), st.sampled_from([0, 1]))
def test_pool_yields_one_item_per_input_in_order(cells: list[bytes | None], workers: int) -> None:
    items = [SourceItem(f"item{i}", cell, None, None, {"k": i})
             for i, cell in enumerate(cells)]
    out = list(decode_stream(items, workers=workers, prefetch=3))
    assert [d.id for d in out] == [i.id for i in items]
    for d, item in zip(out, items):
        assert (d.audio is None) != (d.error is None)
        assert d.extra == item.extra
        if d.error is not None:
            assert d.error.startswith(f"{item.id}: ")
        else:
            assert d.audio.dtype == np.float32 and np.isfinite(d.audio).all()


# ------------------------------------------------------------------------------------- writers

ids = st.text(min_size=1, max_size=40)  # any unicode, incl. "../", "/", NUL, lone surrogates
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=6)


@st.composite
def records(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i, item_id in enumerate(draw(st.lists(ids, min_size=1, max_size=6, unique=True))):
        extra = {"p": draw(values)}
        if draw(st.booleans()):
            out.append({"id": item_id, "error": draw(st.text(max_size=60)), "duration": None, **extra})
        else:
            text = draw(st.text(max_size=60))
            seg = {"id": 0, "seek": 0, "start": 0.0, "end": draw(st.floats(0, 30)), "text": text,
                   "tokens": draw(st.lists(st.integers(0, 51864), max_size=5)), "temperature": 0.0,
                   "avg_logprob": draw(st.floats(allow_nan=True)), "compression_ratio": 1.0,
                   "no_speech_prob": draw(st.floats(0, 1))}
            out.append({"id": item_id, "text": text, "language": "english",
                        "duration": draw(st.floats(0, 1e5)), "segments": [seg], **extra})
    return out


@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records(), st.sampled_from(["jsonl", "parquet"]))
def test_any_record_commits_as_a_readable_shard(tmp_path_factory: pytest.TempPathFactory,
                                                recs: list[dict[str, Any]], fmt: str) -> None:
    out = tmp_path_factory.mktemp("w")
    writer = ShardWriter(out, fmt, shard_size=4)  # type: ignore[arg-type]
    for r in recs:
        writer.add(r)
    writer.flush()
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"records-{i:05d}.{fmt}" for i in range(len(names))]  # no id became a path
    if fmt == "jsonl":
        # JSON Lines separate records by b"\n" only (str.splitlines would also split inside
        # strings holding U+2028 or U+0085, which JSON leaves unescaped).
        back = [json.loads(line) for p in sorted(out.iterdir()) for line in p.read_bytes().split(b"\n") if line]
    else:
        back = [r for p in sorted(out.iterdir()) for r in pq.read_table(p).to_pylist()]
    assert [b["id"] for b in back] == [r["id"] for r in recs]
    for b, r in zip(back, recs):
        if r.get("error") is not None:
            assert b["error"] == r["error"]
        else:
            assert b["text"] == r["text"]
            got = b["segments"][0]["avg_logprob"]
            want = r["segments"][0]["avg_logprob"]
            # JSON has no NaN/Infinity: JSONL writes null; Parquet keeps the float as it is.
            assert got == want or (not math.isfinite(want) and (got is None or not math.isfinite(got)))


# ----------------------------------------------------------------------------------- whole run


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir: Path) -> Any:
    from batchscribe.api import Transcriber

    return Transcriber(model=str(tiny_en_dir), device="cpu", batch_size=4)


def _short_speech() -> bytes:
    audio, rate = sf.read(DEMO_CLIP, dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, audio[: int(1.0 * rate)], rate, format="FLAC")
    return buf.getvalue()


SPEECH = _short_speech()


@settings(deadline=None, max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
                          st.one_of(st.binary(max_size=256), st.just(SPEECH), st.none())),
                min_size=1, max_size=6))
def test_run_over_random_rows_writes_one_record_per_id(transcriber: Any, tmp_path_factory: pytest.TempPathFactory,
                                                       rows: list[tuple[str, bytes | None]]) -> None:
    tmp = tmp_path_factory.mktemp("run")
    src = tmp / "rows.parquet"
    pq.write_table(pa.table({"id": [r[0] for r in rows],
                             "audio": [None if b is None else {"bytes": b, "path": "x"} for _, b in rows]}), src)
    out = tmp / "out"
    result = run([str(src)], out, RunOptions(workers=0, shard_size=2, source=SourceOptions()),
                 transcriber_factory=lambda opts: transcriber)
    written = [json.loads(line) for p in sorted(out.glob("records-*.jsonl"))
               for line in p.read_bytes().split(b"\n") if line]
    assert len(written) == len(rows) == result.summary["items"]
    assert len({r["id"] for r in written}) == len(rows)  # duplicates were numbered, none lost
    assert sorted(p.name for p in tmp.iterdir()) == ["out", "rows.parquet"]  # nothing outside OUT
    by_id = {r["id"]: r for r in written}
    counts = Counter(item_id for item_id, _ in rows)
    for item_id, data in rows:
        if counts[item_id] > 1:
            continue  # renamed <id>#k by the duplicate rule; counted above
        if data == SPEECH:
            assert by_id[item_id].get("error") is None and by_id[item_id]["text"].strip()
        elif data is None:
            assert "the audio cell is empty" in by_id[item_id]["error"]


@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(), min_size=1, max_size=12), min_size=1, max_size=5))
def test_any_manifest_id_can_be_written(tmp_path_factory: pytest.TempPathFactory, raw_ids: list[str]) -> None:
    """Ids from a JSONL manifest (any code point, lone surrogates included) reach a shard intact."""
    from batchscribe.audio.sources import iter_source

    tmp = tmp_path_factory.mktemp("m")
    manifest = tmp / "m.jsonl"
    # ensure_ascii: a lone surrogate can only appear in a UTF-8 file as a \uXXXX escape.
    manifest.write_text("".join(json.dumps({"id": i, "path": "a.wav"}) + "\n" for i in raw_ids), encoding="utf-8")
    items = list(iter_source([str(manifest)], SourceOptions()))
    assert len(items) == len(raw_ids) and len({i.id for i in items}) == len(items)
    writer = ShardWriter(tmp / "out", "jsonl")
    (tmp / "out").mkdir()
    for item in items:
        writer.add({"id": item.id, "error": "x", "duration": None})
    writer.flush()
    back = [json.loads(line)["id"] for line in (tmp / "out" / "records-00000.jsonl").read_bytes().split(b"\n") if line]
    assert back == [i.id for i in items]
    for raw, item in zip(raw_ids, items):
        if raw.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == raw and "#" not in item.id:
            assert item.id == raw  # ids that were valid already are left alone
