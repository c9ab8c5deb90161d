"""Input detection: what cannot be read as a whole raises SourceError (or ConfigError) naming it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscribe.audio.sources import SourceError, SourceOptions, iter_source
from batchscribe.config import ConfigError


def test_input_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'/no/such/file.parquet' does not exist"):
        iter_source(["/no/such/file.parquet"], SourceOptions())
    with pytest.raises(SourceError, match=r"matches no files"):
        iter_source([str(tmp_path / "*.parquet")], SourceOptions())
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(SourceError, match=r"no Parquet files, dataset or audio files found \(1 other files\)"):
        iter_source([str(tmp_path)], SourceOptions())
    pq.write_table(pa.table({"audio": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    with pytest.raises(SourceError, match=r"empty.parquet' contains no items"):
        list(iter_source([str(tmp_path / "empty.parquet")], SourceOptions()))
    with pytest.raises(SourceError, match=r"no input given"):
        iter_source([], SourceOptions())
    with pytest.raises(ConfigError, match=r"shard_index=3 is outside 0..2"):
        SourceOptions(num_shards=3, shard_index=3)


def test_folder_item_counts_match_what_is_read(tmp_path: Path, flac_folder: Path, parquet_path: Path,
                                               reference: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar's total for a folder: the items iter_source then yields, where counting is cheap."""
    import shutil

    from batchscribe.audio.sources import count_folder_items, detect

    assert count_folder_items(flac_folder) == len(list(iter_source([str(flac_folder)], SourceOptions()))) == 100
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copy(parquet_path, shards / "a.parquet")
    shutil.copy(parquet_path, shards / "b.parquet")
    assert count_folder_items(shards) == 2 * pq.read_table(parquet_path, columns=["id"]).num_rows
    meta = tmp_path / "audiofolder"
    meta.mkdir()
    (meta / "metadata.csv").write_text("file_name,text\n" + "".join(f"{r['id']}.flac,x\n" for r in reference[:7]))
    assert count_folder_items(meta) == len(list(iter_source([str(meta)], SourceOptions()))) == 7
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")
    assert count_folder_items(tmp_path / "saved") is None  # a dataset: not cheap to know here
    monkeypatch.setattr(detect, "_COUNT_AT_MOST", 10)
    assert count_folder_items(flac_folder) is None  # too many files to list before the run starts
