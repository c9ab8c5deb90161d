"""fleet/wire.py: the job a --gpus child reads is the parent's, option for option."""

from __future__ import annotations

from pathlib import Path

from batchscribe.audio.sources import SourceOptions
from batchscribe.config import DecodeOptions, EngineOptions
from batchscribe.fleet.wire import decode_job, encode_job
from batchscribe.run import RunOptions


def test_a_job_round_trips_and_stays_hashable(tmp_path: Path) -> None:
    opts = RunOptions(
        model="base", cache_dir=tmp_path / "cache", format="parquet", workers=2, max_errors=5, retry_errors=True,
        engine=EngineOptions(device="cuda:0", dtype="bfloat16", batch_size=64, cross_kv="fp8"),
        decode=DecodeOptions(language="de", temperatures=(0.0, 0.4), suppress_tokens=(1, 2, 3), word_timestamps=True,
                             initial_prompt="Müller, Straße", condition_on_previous_text=True),
        source=SourceOptions(id_column="key", passthrough=("speaker", "chapter"), num_shards=6, shard_index=4,
                             prompt_column="names", exclude=(str(tmp_path / "out"),)),
    )  # fmt: skip
    line = encode_job(["a.parquet", "b/"], tmp_path / "out", opts)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # the child reads one line; the pipe stays open
    inputs, output, back = decode_job(line)
    assert (inputs, output, back) == (["a.parquet", "b/"], tmp_path / "out", opts)
    hash(back.decode)  # engines are keyed by DecodeOptions


def test_defaults_round_trip() -> None:
    assert decode_job(encode_job([], Path("out"), RunOptions()))[2] == RunOptions()
