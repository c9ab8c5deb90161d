"""Parquet: ids, texts and byte-identical audio against pyarrow reading the same file directly."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscribe.audio.sources import SourceError, SourceItem, SourceOptions, iter_source
from tests.audio.sources.rows import assert_same_rows, payload


def test_parquet_file(parquet_path: Path, reference: list[dict]) -> None:
    items = list(iter_source([str(parquet_path)], SourceOptions()))
    assert_same_rows(items, reference)
    assert items[0].path == reference[0]["audio"]["path"]  # the file name stored with the bytes


def test_parquet_bytes_are_views_of_arrow_buffers_and_pickle_as_bytes(tmp_path: Path, parquet_path: Path,
                                                                    reference: list[dict]) -> None:
    """With audio_views, encoded audio is handed out without a copy (a flat read-only byte view), for
    a {bytes, path} struct column (nulls included) and a plain binary column; pickling (to a decode
    process) sends bytes. Without, bytes. pyarrow's own to_pylist is the reference."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    assert all(type(i.audio_bytes) is bytes for i in iter_source([str(parquet_path)], SourceOptions()))  # copies
    items = list(iter_source([str(parquet_path)], SourceOptions(audio_views=True)))
    assert all(isinstance(i.audio_bytes, memoryview) and i.audio_bytes.format == "B" for i in items)
    again = pickle.loads(pickle.dumps(items[3]))
    assert type(again.audio_bytes) is bytes and again == SourceItem(items[3].id, reference[3]["audio"]["bytes"],
                                                                      items[3].path, items[3].text, items[3].extra)

    table = pq.read_table(parquet_path, columns=["id", "audio"]).slice(0, 9)
    audio = table.column("audio").combine_chunks()
    blobs = audio.field("bytes").to_pylist()
    with_nulls = pa.StructArray.from_arrays([audio.field("bytes"), audio.field("path")], names=["bytes", "path"],
                                            mask=pa.array([i == 4 for i in range(9)]))  # fmt: skip
    for name, column in (("struct", with_nulls), ("binary", pa.array(blobs, pa.large_binary()))):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": table.column("id"), "audio": column}), path, row_group_size=4)
        got = list(iter_source([str(path)], SourceOptions(audio_views=True)))
        assert [i.id for i in got] == table.column("id").to_pylist()
        for i, item in enumerate(got):
            if name == "struct" and i == 4:
                assert item.audio_bytes is None and item.path is None  # a null cell: an error record later
            else:
                assert isinstance(item.audio_bytes, memoryview) and bytes(item.audio_bytes) == blobs[i]


def test_wrong_audio_column_type(parquet_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'duration_s' has type double, not audio.*--audio-column"):
        next(iter_source([str(parquet_path)], SourceOptions(audio_column="duration_s")))


def test_parquet_without_id_and_path_strings(tmp_path: Path, reference: list[dict]) -> None:
    (tmp_path / "clips").mkdir()
    for row in reference[:3]:
        (tmp_path / "clips" / f"{row['id']}.flac").write_bytes(row["audio"]["bytes"])
    table = pa.table({"audio": [f"clips/{r['id']}.flac" for r in reference[:3]],
                      "sentence": [r["text"] for r in reference[:3]]})
    pq.write_table(table, tmp_path / "part.parquet")
    items = list(iter_source([str(tmp_path / "*.parquet")], SourceOptions(text_column="sentence")))
    assert [i.id for i in items] == ["part:0", "part:1", "part:2"]
    assert [i.text for i in items] == [r["text"] for r in reference[:3]]
    assert [payload(i) for i in items] == [r["audio"]["bytes"] for r in reference[:3]]
