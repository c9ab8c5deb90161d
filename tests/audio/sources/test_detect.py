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
