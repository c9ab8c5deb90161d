"""--prompt-column: each item's own initial prompt from an input column, through `run` on real rows
with real tiny.en: prompted items decode to openai-whisper's DecodingTask tokens with that prompt
(`whisper.decode(prompt=...)` on the same log-mel), null/empty cells decode unprompted, a long
prompt is trimmed with one warning naming the item; a missing column and --initial-prompt with
--prompt-column are usage errors before the model loads."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch

from batchscribe.audio.sources import SourceError, SourceOptions
from batchscribe.config import DecodeOptions, EngineOptions
from batchscribe.run import RunOptions, run
from tests.engine.helpers import openai_model

whisper = pytest.importorskip("whisper")
LONG = "Kenobi, Skywalker, Coruscant. " * 60  # well over 223 tokens


def _table(shared_data: Path, tmp_path: Path) -> tuple[Path, list[dict]]:
    rows = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet").to_pylist()
    rows += pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet").to_pylist()[:2]
    prompts = ["Mr. Bennet's girls: stew, turnips, carrots.", None, "", LONG, "Glossary: Gutenberg.", "   "]
    for row, prompt in zip(rows, prompts):
        row["names"] = prompt
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rows


def _opts(tiny_en_dir: Path, **source) -> RunOptions:
    return RunOptions(model=str(tiny_en_dir), engine=EngineOptions(device="cpu", batch_size=4), workers=0,
                      decode=DecodeOptions(temperatures=(0.0,)), source=SourceOptions(**source))  # fmt: skip


def test_each_row_is_prompted_with_its_own_cell(tmp_path, tiny_en_dir, shared_data, caplog) -> None:
    import json

    from batchscribe.audio.features import LogMel
    from batchscribe.constants import N_SAMPLES
    from batchscribe.output.writers import read_shard

    path, rows = _table(shared_data, tmp_path)
    with caplog.at_level(logging.WARNING):
        run([str(path)], tmp_path / "out", _opts(tiny_en_dir, prompt_column="names"))
    records = {r["id"]: r for shard in sorted((tmp_path / "out").glob("*.jsonl")) for r in read_shard(shard)}
    reference, features = openai_model(tiny_en_dir), LogMel(80)
    same = swayed = 0
    for row in rows:
        audio = torch.from_numpy(sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")[0])
        padded = torch.zeros(N_SAMPLES)
        padded[: len(audio)] = audio[:N_SAMPLES]
        prompt = (row["names"] or "").strip() or None  # null, empty or blank: no prompt
        options = whisper.DecodingOptions(prompt=prompt, temperature=0.0, language="en", fp16=False)
        ref = whisper.decode(reference, features(padded[None])[0], options)
        same += [t for s in records[row["id"]]["segments"] for t in s["tokens"]] == ref.tokens
        if prompt:  # the prompt matters: openai's unprompted decode of the row differs
            plain = whisper.decode(reference, features(padded[None])[0], whisper.DecodingOptions(
                temperature=0.0, language="en", fp16=False))
            swayed += plain.tokens != ref.tokens
    print(f"\n{same}/{len(rows)} rows decode to openai-whisper's tokens under their own prompt")
    assert same >= len(rows) - 1 and swayed >= 1
    warnings = [r.getMessage() for r in caplog.records if "only its last 223" in r.getMessage()]
    assert len(warnings) == 1 and rows[3]["id"] in warnings[0] and "--prompt-column" in warnings[0]
    config = json.loads((tmp_path / "out" / "run_config.json").read_text())
    assert config["source_options"]["prompt_column"] == "names"


def test_a_missing_prompt_column_is_named_before_the_model_loads(tmp_path, shared_data) -> None:
    path, _ = _table(shared_data, tmp_path)

    def no_model(opts):
        raise AssertionError("the model was loaded before the column check")

    with pytest.raises(SourceError, match=r"no prompt column 'glossary'; available columns: .*names.*--prompt-column"):
        run([str(path)], tmp_path / "out", _opts(Path("unused"), prompt_column="glossary"), transcriber_factory=no_model)


def test_initial_prompt_with_prompt_column_is_refused(tmp_path) -> None:
    from typer.testing import CliRunner

    from batchscribe.cli import app

    result = CliRunner().invoke(app, ["run", str(tmp_path), "-o", str(tmp_path / "out"), "--initial-prompt", "x",
                                      "--prompt-column", "names"])  # fmt: skip
    assert result.exit_code == 2 and "--initial-prompt and --prompt-column" in result.output
