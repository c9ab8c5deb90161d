"""Alignment heads (model/alignment_heads.py): the table equals openai-whisper's own
_ALIGNMENT_HEADS, decoded; a checkpoint's generation_config.json wins; a model with none is a
usage error that names the model and the fix."""

from __future__ import annotations

import base64
import gzip

import numpy as np
import pytest

from batchscribe.config import ConfigError
from batchscribe.model.alignment_heads import OPENAI_ALIGNMENT_HEADS, resolve_alignment_heads
from batchscribe.model.dims import ModelDims

whisper = pytest.importorskip("whisper")
_HEADS_PER_LAYER = {"tiny": 6, "base": 8, "small": 12, "medium": 16, "large": 20}


def _openai_heads(name: str) -> tuple[tuple[int, int], ...]:
    mask = np.frombuffer(gzip.decompress(base64.b85decode(whisper._ALIGNMENT_HEADS[name])), dtype=bool)
    per_layer = 20 if "turbo" in name else _HEADS_PER_LAYER[name.split(".")[0].split("-")[0]]
    return tuple((int(a), int(b)) for a, b in np.argwhere(mask.reshape(-1, per_layer)))


def test_table_equals_openai_whisper() -> None:
    for name, heads in OPENAI_ALIGNMENT_HEADS.items():
        assert heads == _openai_heads(name), name
    assert OPENAI_ALIGNMENT_HEADS["large-v3"] == _openai_heads("large")  # openai's "large" is v3


def _dims(n_vocab: int, layers: int, heads: int, n_mels: int = 80) -> ModelDims:
    return ModelDims(n_mels, n_vocab, 1500, heads * 64, heads, layers, 448, heads * 64, heads, layers)


def test_resolution_order() -> None:
    tiny_en = _dims(51864, 4, 6)
    listed = {"alignment_heads": [[0, 1], [3, 5]]}
    assert resolve_alignment_heads(listed, tiny_en, ("x",), "x") == ((0, 1), (3, 5))  # the checkpoint's own
    assert resolve_alignment_heads({}, tiny_en, ("my-folder",), "x") == OPENAI_ALIGNMENT_HEADS["tiny.en"]  # by shape
    large = _dims(51865, 32, 20)  # large-v1 and -v2 share a shape: only a name tells them apart
    assert resolve_alignment_heads({}, large, ("openai/whisper-large-v2",), "x") == OPENAI_ALIGNMENT_HEADS["large-v2"]
    with pytest.raises(ConfigError, match=r"model 'my-large'.*alignment_heads.*--word-timestamps"):
        resolve_alignment_heads({}, large, ("my-large",), "my-large")
    with pytest.raises(ConfigError, match="outside its 4 decoder layers"):
        resolve_alignment_heads({"alignment_heads": [[4, 0]]}, tiny_en, ("x",), "x")


def test_a_model_without_heads_is_a_usage_error_before_loading(tmp_path, tiny_en_dir) -> None:
    """The Transcriber refuses at once (before the weights load); the CLI maps it to exit 2."""
    import json

    from typer.testing import CliRunner

    from batchscribe.cli import app

    folder = tmp_path / "odd-model"
    folder.mkdir()
    for f in tiny_en_dir.iterdir():
        if f.is_file() and f.name not in ("generation_config.json", "batchscribe_source.json", "config.json"):
            (folder / f.name).symlink_to(f)
    config = json.loads((tiny_en_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 51866, "num_mel_bins": 80}))
    generation = json.loads((tiny_en_dir / "generation_config.json").read_text())
    generation.pop("alignment_heads")
    (folder / "generation_config.json").write_text(json.dumps(generation))
    result = CliRunner().invoke(app, ["run", "--demo", "-o", str(tmp_path / "o"), "--model", str(folder),
                                      "--device", "cpu", "--word-timestamps"], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert "odd-model" in result.output and "alignment_heads" in result.output
