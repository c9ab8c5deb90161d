"""CTranslate2 -> Hugging Face conversion: complete folders that transformers loads and transcribes with.

References: transformers' WhisperForConditionalGeneration / WhisperProcessor and the reference
transcript of the JFK clip.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from batchscribe.weights.ct2_convert import SOURCE_FILE, convert_ct2_to_hf
from batchscribe.weights.ct2_format import Ct2FormatError, read_ct2
from tests.weights.helpers import ct2_pieces, installed_package_dirs, raw_bytes


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_transformers_loads_converted_folder(name: str, request: pytest.FixtureRequest) -> None:
    transformers = pytest.importorskip("transformers")
    folder = request.getfixturevalue(f"{name.replace('.', '_')}_dir")
    config = transformers.WhisperConfig.from_pretrained(folder)
    expected = set(transformers.WhisperForConditionalGeneration(config).state_dict())
    stored = set(load_file(str(folder / "model.safetensors")))
    assert stored == expected - {"proj_out.weight"}  # each parameter exactly once, proj_out tied
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        folder, output_loading_info=True, dtype=torch.float16
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    ct2 = read_ct2(ct2_pieces(installed_package_dirs(name)))
    assert torch.equal(model.model.encoder.conv1.weight, ct2.variables["encoder/conv1/weight"])
    heads = int(ct2.variables["encoder/num_heads"].item())
    assert config.encoder_attention_heads == config.decoder_attention_heads == heads
    assert (config.num_mel_bins, config.max_source_positions, config.max_target_positions) == (80, 1500, 448)
    ct2_cfg = json.loads((installed_package_dirs(name)[0] / "config.json").read_text())
    gen = transformers.GenerationConfig.from_pretrained(folder)
    assert gen.suppress_tokens == ct2_cfg["suppress_ids"] == config.suppress_tokens
    assert gen.begin_suppress_tokens == ct2_cfg["suppress_ids_begin"]
    assert gen.alignment_heads == ct2_cfg["alignment_heads"]
    assert gen.is_multilingual == (name == "base")


def test_split_model_across_folders_converts_identically(tiny_en_dir: Path, tmp_path: Path) -> None:
    src = installed_package_dirs("tiny.en")[0]
    data = (src / "model.bin").read_bytes()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    cuts = [0, len(data) // 3, 2 * len(data) // 3 + 7, len(data)]
    for i, folder in enumerate([a, a, b]):
        (folder / f"model.bin.part{i + 1}").write_bytes(data[cuts[i] : cuts[i + 1]])
    for f in ("tokenizer.json", "config.json"):
        (b / f).write_bytes((src / f).read_bytes())
    out = convert_ct2_to_hf([a, b], tmp_path / "hf")
    ref, got = load_file(str(tiny_en_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert ref.keys() == got.keys()
    assert all(raw_bytes(ref[k]) == raw_bytes(got[k]) for k in ref)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert json.loads((out / f).read_text()) == json.loads((tiny_en_dir / f).read_text()), f
    source = json.loads((out / SOURCE_FILE).read_text())
    assert [Path(f["path"]).name for f in source["files"]] == ["model.bin.part1", "model.bin.part2", "model.bin.part3"]
    assert not list(tmp_path.glob(".hf.tmp-*"))
    with pytest.raises(FileExistsError, match="already exists"):
        convert_ct2_to_hf([a, b], out)

    (a / "model.bin.part2").unlink()
    with pytest.raises(Ct2FormatError, match="model.bin.part2 is missing"):
        convert_ct2_to_hf([a, b], tmp_path / "hf2")
    assert not (tmp_path / "hf2").exists()


def test_jfk_transcript_through_transformers(tiny_en_dir: Path, shared_data: Path) -> None:
    transformers = pytest.importorskip("transformers")
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    audio, rate = sf.read(shared_data / "misc" / "jfk.flac", dtype="float32")
    audio = soxr.resample(audio.mean(axis=1) if audio.ndim > 1 else audio, rate, 16000)
    processor = transformers.WhisperProcessor.from_pretrained(tiny_en_dir)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(tiny_en_dir, dtype=torch.float32)
    features = processor(audio, sampling_rate=16000, return_tensors="pt").input_features  # [1, 80, 3000]
    text = processor.batch_decode(model.generate(features), skip_special_tokens=True)[0]
    words = re.sub(r"[^a-z ]", "", text.lower()).split()
    expected = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    # Words only: on this 44.1 kHz stereo recording tiny.en writes no comma after "Americans"
    # (openai-whisper with the same weights agrees), so punctuation is not compared.
    assert words == re.sub(r"[^a-z ]", "", expected.lower()).split(), text


def test_converted_tokenizer_has_the_lost_merge_back(base_dir: Path) -> None:
    """The base package's tokenizer.json lacks the merge "Ġ t" (tiktoken rank 256); the converted
    folder's file has it back, so a tool that reads the folder directly (transformers here) encodes
    as openai's tiktoken ranks, which the model was trained on."""
    transformers = pytest.importorskip("transformers")
    wt = pytest.importorskip("whisper.tokenizer")
    fast = transformers.WhisperTokenizerFast.from_pretrained(base_dir)
    ref = wt.get_tokenizer(True, num_languages=99)
    for text in (" to", " to the store", " Went to town, to see it too."):
        assert fast.encode(text, add_special_tokens=False) == ref.encode(text), text
    assert ref.encode(" to") == [281]
