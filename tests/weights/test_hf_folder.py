"""HF folders: pickled checkpoints refused, safetensors (sharded too) loaded under transformers' names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from batchscribe.weights.hf_folder import ModelFormatError, load_state_dict
from batchscribe.weights.resolve import resolve_model
from tests.weights.helpers import load_dims


def test_pickle_only_folder_is_refused(tiny_en_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_en_dir / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 would run code if unpickled")
    for call in (lambda: resolve_model(str(folder), cache_dir=tmp_path), lambda: load_state_dict(folder)):
        with pytest.raises(ModelFormatError, match="pytorch_model.bin.*safetensors only"):
            call()


def test_state_dict_matches_transformers_names(tiny_en_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    state = load_state_dict(tiny_en_dir)
    config = transformers.WhisperConfig.from_pretrained(tiny_en_dir)
    reference = transformers.WhisperForConditionalGeneration(config).state_dict()
    assert state.keys() == reference.keys()
    assert all(state[k].shape == reference[k].shape for k in state)
    assert state["proj_out.weight"] is state["model.decoder.embed_tokens.weight"]
    dims = load_dims(tiny_en_dir)
    assert (dims.n_mels, dims.n_vocab, dims.n_text_layer, dims.n_audio_head) == (80, 51864, 4, 6)


def test_sharded_safetensors_load(tiny_en_dir: Path, tmp_path: Path) -> None:
    full = load_file(str(tiny_en_dir / "model.safetensors"))
    keys = sorted(full)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for shard, names in shards.items():
        save_file({k: full[k] for k in names}, str(tmp_path / shard))
        weight_map.update({k: shard for k in names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(tiny_en_dir / "config.json", tmp_path)
    state = load_state_dict(tmp_path)
    assert state.keys() == set(full) | {"proj_out.weight"}
    assert all(torch.equal(state[k], full[k]) for k in full)
    assert resolve_model(str(tmp_path), cache_dir=tmp_path / "cache") == tmp_path
