"""Exact conversion of CTranslate2 (faster-whisper) Whisper models to a Hugging Face folder.

We parse `model.bin` ourselves so that ctranslate2 need not be installed. The layout (see
CTranslate2's `python/ctranslate2/specs/model_spec.py` writer and `src/models/model.cc` reader):
little-endian, no padding; `u32 binary_version`; from v2 a spec name string and `u32 revision`;
`u32 n_variables`, each `name, u8 rank, u32 dims[rank], u8 dtype, u32 n_bytes, data`; from v3
`u32 n_aliases` and (alias, target) string pairs. A string is `u16 length` counting its NUL.
Before v4 the dtype byte is an item size and the u32 counts items, not bytes.

The converted folder holds fp16 weights bit for bit (no arithmetic is done on any tensor: fused
projections are only sliced by rows), plus the config, generation config, tokenizer and
preprocessor files transformers needs to load it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from safetensors.torch import save_file

from batchscribe.constants import CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE

SUPPORTED_BINARY_VERSION = 6
CONVERTER_VERSION = 1  # bump when the written folder changes; cached conversions are then redone
SOURCE_FILE = "batchscribe_source.json"
N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|> in 0.02 s steps

# CTranslate2 DataType ids (binary_version >= 4).
_DTYPES: dict[int, torch.dtype] = {
    0: torch.float32,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.float16,
    5: torch.bfloat16,
}
# Before v4 the byte is an item size; CTranslate2 resolved it with this (lossy) table.
_DTYPES_BY_ITEM_SIZE: dict[int, torch.dtype] = {4: torch.float32, 2: torch.int16, 1: torch.int8}
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GELU = 3  # CTranslate2 ActivationType::GELU (exact erf GELU, HF "gelu")


class Ct2FormatError(ValueError):
    """A model.bin that cannot be read or converted; the message names the file and the problem."""


class ChecksumError(ValueError):
    """A model file whose sha256 differs from the pinned value."""

    def __init__(self, path: Path, expected: str, actual: str, fix: str) -> None:
        self.path, self.expected, self.actual = path, expected, actual
        super().__init__(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}. "
            f"The file is corrupt or not the release this version of batchscribe pins. Fix: {fix}"
        )


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class Ct2Model:
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, torch.Tensor]  # CPU tensors, views into the file buffer
    aliases: dict[str, str]  # alias -> target variable name
    sources: tuple[SourceFile, ...]


def _read_and_hash(paths: Sequence[Path]) -> tuple[bytearray, tuple[SourceFile, ...]]:
    buf = bytearray()
    sources = []
    for path in paths:
        digest = hashlib.sha256()
        start = len(buf)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
                buf += chunk
        sources.append(SourceFile(Path(path), len(buf) - start, digest.hexdigest()))
    return buf, tuple(sources)


class _Cursor:
    def __init__(self, buf: bytearray, where: str) -> None:
        self.buf, self.pos, self.where = buf, 0, where

    def take(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.buf):
            raise Ct2FormatError(
                f"{self.where} is truncated: needed {n} bytes at offset {start}, file has "
                f"{len(self.buf)}; a model.bin.partN piece is probably missing or incomplete"
            )
        self.pos += n
        return start

    def uint(self, n: int) -> int:
        start = self.take(n)
        return int.from_bytes(self.buf[start : start + n], "little")

    def string(self) -> str:
        n = self.uint(2)
        start = self.take(n)
        return bytes(self.buf[start : start + n]).split(b"\0", 1)[0].decode("utf-8")


def read_ct2(
    paths: Sequence[Path],
    expected_sha256: Mapping[str, str] | None = None,
    checksum_fix: str = "re-download the model",
) -> Ct2Model:
    """Parse `model.bin`, or its `model.bin.partN` pieces concatenated in the order given.

    `expected_sha256` maps a file name to its pinned hex digest; a mismatch raises ChecksumError
    before anything is parsed.
    """
    buf, sources = _read_and_hash(paths)
    for src in sources:
        want = (expected_sha256 or {}).get(src.path.name)
        if want is not None and want != src.sha256:
            raise ChecksumError(src.path, want, src.sha256, checksum_fix)
    where = " + ".join(str(p) for p in paths)
    cur = _Cursor(buf, where)
    version = cur.uint(4)
    if not 1 <= version <= SUPPORTED_BINARY_VERSION:
        raise Ct2FormatError(
            f"{where}: binary_version {version} is not supported (1..{SUPPORTED_BINARY_VERSION}); "
            "re-export the model with a CTranslate2 release that writes version 6"
        )
    spec, revision = (cur.string(), cur.uint(4)) if version >= 2 else ("", 1)
    if spec not in ("", "WhisperSpec"):
        raise Ct2FormatError(f"{where}: spec {spec!r} is not a Whisper model (WhisperSpec)")
    variables: dict[str, torch.Tensor] = {}
    for _ in range(cur.uint(4)):
        name = cur.string()
        shape = [cur.uint(4) for _ in range(cur.uint(1))]
        if version >= 4:
            code = cur.uint(1)
            if code not in _DTYPES:
                raise Ct2FormatError(f"{where}: variable {name} has unknown dtype id {code}")
            dtype, n_bytes = _DTYPES[code], cur.uint(4)
        else:
            size = cur.uint(1)
            if size not in _DTYPES_BY_ITEM_SIZE:
                raise Ct2FormatError(f"{where}: variable {name} has unknown item size {size}")
            dtype = _DTYPES_BY_ITEM_SIZE[size]
            n_bytes = cur.uint(4) * size
        count = 1
        for d in shape:
            count *= d
        if n_bytes != count * dtype.itemsize:
            raise Ct2FormatError(f"{where}: variable {name} {shape} {dtype} has {n_bytes} bytes")
        start = cur.take(n_bytes)
        if count:  # a view into the buffer: no copy until the mapper clones what it keeps
            variables[name] = torch.frombuffer(buf, dtype=dtype, count=count, offset=start).view(shape)
        else:
            variables[name] = torch.empty(shape, dtype=dtype)
    aliases: dict[str, str] = {}
    if version >= 3:
        for _ in range(cur.uint(4)):
            alias = cur.string()
            aliases[alias] = cur.string()
    if cur.pos != len(buf):
        raise Ct2FormatError(f"{where}: {len(buf) - cur.pos} trailing bytes after the aliases")
    return Ct2Model(version, spec or "WhisperSpec", revision, variables, aliases, sources)


def _scalar(model: Ct2Model, name: str, default: int | None = None) -> int | None:
    value = model.variables.get(name)
    return default if value is None else int(value.reshape(-1)[0].item())


def _layer_count(variables: Mapping[str, torch.Tensor], side: str) -> int:
    pattern = re.compile(rf"^{side}/layer_(\d+)/")
    found = {int(m.group(1)) for name in variables if (m := pattern.match(name))}
    if found != set(range(len(found))) or not found:
        raise Ct2FormatError(f"{side} layers are missing or not numbered 0..n-1: {sorted(found)}")
    return len(found)


class _Mapper:
    """Moves CT2 variables to HF names, each exactly once; fused ones are split by rows."""

    def __init__(self, model: Ct2Model) -> None:
        self.model = model
        self.unused = {n for n, v in model.variables.items() if v.dim() > 0}
        self.out: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        if name not in self.model.variables:
            raise Ct2FormatError(f"variable {name} is missing from the CTranslate2 model")
        if name not in self.unused:
            raise Ct2FormatError(f"variable {name} used twice")  # a mapping bug, not user data
        self.unused.discard(name)
        tensor = self.model.variables[name]
        if tensor.dtype not in _FLOAT_DTYPES:
            raise Ct2FormatError(
                f"variable {name} is {tensor.dtype} (a quantized model); convert the original "
                "checkpoint with ct2-transformers-converter --quantization float16 instead"
            )
        return tensor

    def put(self, hf_name: str, tensor: torch.Tensor) -> None:
        assert hf_name not in self.out, hf_name
        # clone: safetensors refuses tensors that share storage (row slices of one fused weight).
        self.out[hf_name] = tensor.clone()

    def linear(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.take(f"{ct2}/weight"))
        self.put(f"{hf}.bias", self.take(f"{ct2}/bias"))

    def norm(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.take(f"{ct2}/gamma"))
        self.put(f"{hf}.bias", self.take(f"{ct2}/beta"))

    def fused(self, ct2: str, hf_prefix: str, parts: Sequence[str]) -> None:
        """Split a fused [len(parts) * d, d] projection; k_proj has no bias in HF Whisper."""
        fused = self.take(f"{ct2}/weight")  # [len(parts) * d, d]
        if fused.dim() != 2 or fused.shape[0] != len(parts) * fused.shape[1]:
            raise Ct2FormatError(f"{ct2}/weight has shape {list(fused.shape)}; expected [{len(parts)}*d, d]")
        weights = fused.chunk(len(parts), dim=0)  # each [d, d]
        biases = self.take(f"{ct2}/bias").chunk(len(parts), dim=0)  # each [d]
        for part, w, b in zip(parts, weights, biases):
            self.put(f"{hf_prefix}.{part}.weight", w)
            if part == "k_proj":
                if torch.count_nonzero(b).item() != 0:
                    raise Ct2FormatError(f"{ct2}/bias: the key part is not zero; HF k_proj has no bias")
            else:
                self.put(f"{hf_prefix}.{part}.bias", b)


def ct2_to_hf_state_dict(model: Ct2Model) -> dict[str, torch.Tensor]:
    """HF WhisperForConditionalGeneration names (without the tied proj_out.weight)."""
    m = _Mapper(model)
    for side in ("encoder", "decoder"):
        hf = f"model.{side}"
        m.put(f"{hf}.embed_positions.weight", m.take(f"{side}/position_encodings/encodings"))
        m.norm(f"{side}/layer_norm", f"{hf}.layer_norm")
        for i in range(_layer_count(model.variables, side)):
            src, dst = f"{side}/layer_{i}", f"{hf}.layers.{i}"
            m.fused(f"{src}/self_attention/linear_0", f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"))
            m.linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
            m.norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            if side == "decoder":
                m.linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
                m.fused(f"{src}/attention/linear_1", f"{dst}.encoder_attn", ("k_proj", "v_proj"))
                m.linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
                m.norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
            m.linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
            m.linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
            m.norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    m.linear("encoder/conv1", "model.encoder.conv1")
    m.linear("encoder/conv2", "model.encoder.conv2")
    m.put("model.decoder.embed_tokens.weight", m.take("decoder/embeddings/weight"))
    # The output projection must be tied to the embedding: HF Whisper has no separate proj_out.
    target = model.aliases.get("decoder/projection/weight")
    if target is None and "decoder/projection/weight" in model.variables:
        proj = m.take("decoder/projection/weight")
        if not torch.equal(proj, model.variables["decoder/embeddings/weight"]):
            raise Ct2FormatError("decoder/projection/weight differs from the embedding (untied)")
    elif target not in (None, "decoder/embeddings/weight"):
        raise Ct2FormatError(f"decoder/projection/weight aliases {target}, not the embedding")
    if m.unused:
        raise Ct2FormatError(f"unknown CTranslate2 variables (not a Whisper layout?): {sorted(m.unused)}")
    _check_structure(model)
    return m.out


def _check_structure(model: Ct2Model) -> None:
    expected = {"decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0}
    for name, want in expected.items():
        got = _scalar(model, name, want)
        if got != want:
            raise Ct2FormatError(f"{name}={got}; HF Whisper needs {want}")
    act = _scalar(model, "decoder/activation", _GELU)
    if act != _GELU:
        raise Ct2FormatError(f"decoder/activation={act}; HF Whisper uses GELU ({_GELU})")


@dataclass(frozen=True)
class _Tokens:
    """Ids read from the CT2 tokenizer.json (never hard-coded)."""

    by_content: dict[str, int]
    special: list[tuple[int, str]]  # (id, content) in id order

    def id(self, content: str) -> int:
        if content not in self.by_content:
            raise Ct2FormatError(f"tokenizer.json has no {content} token")
        return self.by_content[content]


def _tokenizer_with_timestamps(tok: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any], _Tokens]:
    added = tok["added_tokens"]
    by_content = {t["content"]: t["id"] for t in added}
    if "<|0.00|>" not in by_content:
        first = by_content["<|notimestamps|>"] + 1
        taken = {t["id"] for t in added} | set(tok["model"]["vocab"].values())
        if any(first + i in taken for i in range(N_TIMESTAMPS)):
            raise Ct2FormatError(f"tokenizer.json: ids {first}..{first + 1500} are not free for timestamps")
        for i in range(N_TIMESTAMPS):
            added.append(
                {"id": first + i, "content": f"<|{i * 0.02:.2f}|>", "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": False}
            )
            by_content[added[-1]["content"]] = first + i
    n_tokens = 1 + max(max(by_content.values()), max(tok["model"]["vocab"].values()))
    if n_tokens != vocab_size:
        raise Ct2FormatError(f"tokenizer has {n_tokens} tokens but the embedding has {vocab_size} rows")
    special = sorted((t["id"], t["content"]) for t in added if t["special"])
    return tok, _Tokens(by_content, special)


def _hf_config(model: Ct2Model, sd: Mapping[str, torch.Tensor], tokens: _Tokens, ct2_cfg: dict) -> dict:
    vocab_size, d_model = sd["model.decoder.embed_tokens.weight"].shape
    n_enc = _layer_count(model.variables, "encoder")
    n_dec = _layer_count(model.variables, "decoder")
    eot = tokens.id("<|endoftext|>")
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": vocab_size,
        "num_mel_bins": sd["model.encoder.conv1.weight"].shape[1],
        "d_model": d_model,
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        "num_hidden_layers": n_enc,
        # Whisper's head size is 64 in every released model; the spec's scalars win when present.
        "encoder_attention_heads": _scalar(model, "encoder/num_heads", d_model // 64),
        "decoder_attention_heads": _scalar(model, "decoder/num_heads", d_model // 64),
        "encoder_ffn_dim": sd["model.encoder.layers.0.fc1.weight"].shape[0],
        "decoder_ffn_dim": sd["model.decoder.layers.0.fc1.weight"].shape[0],
        "max_source_positions": sd["model.encoder.embed_positions.weight"].shape[0],
        "max_target_positions": sd["model.decoder.embed_positions.weight"].shape[0],
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": tokens.id("<|startoftranscript|>"),
        "begin_suppress_tokens": list(ct2_cfg.get("suppress_ids_begin", [])),
        "suppress_tokens": list(ct2_cfg.get("suppress_ids", [])),
        "max_length": sd["model.decoder.embed_positions.weight"].shape[0],
        "dtype": str(sd["model.decoder.embed_tokens.weight"].dtype).removeprefix("torch."),
    }


def _generation_config(config: dict, tokens: _Tokens, ct2_cfg: dict) -> dict:
    sot = tokens.id("<|startoftranscript|>")
    multilingual = config["vocab_size"] >= 51865
    gen: dict[str, Any] = {
        "alignment_heads": [list(h) for h in ct2_cfg.get("alignment_heads", [])],
        "begin_suppress_tokens": config["begin_suppress_tokens"],
        "suppress_tokens": config["suppress_tokens"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "decoder_start_token_id": sot,
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": 50,  # 1.0 s, openai's max_initial_timestamp
        "max_length": config["max_target_positions"],
        "no_timestamps_token_id": tokens.id("<|notimestamps|>"),
        "prev_sot_token_id": tokens.id("<|startofprev|>"),
        "return_timestamps": False,
    }
    if multilingual:
        translate = tokens.id("<|translate|>")
        # Language tokens sit between <|startoftranscript|> and <|translate|> in every vocabulary.
        langs = {content: i for i, content in tokens.special if sot < i < translate}
        if "lang_ids" in ct2_cfg and sorted(langs.values()) != sorted(ct2_cfg["lang_ids"]):
            raise Ct2FormatError("config.json lang_ids disagree with the tokenizer's language tokens")
        gen["lang_to_id"] = langs
        gen["task_to_id"] = {"transcribe": tokens.id("<|transcribe|>"), "translate": translate}
        # Without a task transformers detects the language but then forces no task token; the hub's
        # configs get "transcribe" from the deprecated forced_decoder_ids, we name the task instead.
        gen["task"] = "transcribe"
    return gen


def _tokenizer_files(tokens: _Tokens, n_mels: int) -> dict[str, dict]:
    eot = "<|endoftext|>"
    named = {"bos_token": eot, "eos_token": eot, "pad_token": eot, "unk_token": eot}
    # transformers finds the first timestamp as all_special_ids[-1] + 1: the list must be the
    # special tokens in id order, ending at <|notimestamps|>.
    extra = [content for _, content in tokens.special]
    tokenizer_config = {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        **named,
        "additional_special_tokens": extra,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,  # BPE: cleanup would strip real spaces
        "model_max_length": 1024,
    }
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": n_mels,
        "sampling_rate": SAMPLE_RATE,
        "n_fft": N_FFT,
        "hop_length": HOP_LENGTH,
        "chunk_length": CHUNK_LENGTH,
        "n_samples": N_SAMPLES,
        "nb_max_frames": N_FRAMES,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": {**named, "additional_special_tokens": extra},
        "preprocessor_config.json": preprocessor,
    }


def find_ct2_files(src_dirs: Sequence[Path]) -> tuple[list[Path], Path, Path | None]:
    """(model pieces in order, tokenizer.json, CT2 config.json or None) across `src_dirs`."""
    whole = [d / "model.bin" for d in src_dirs if (d / "model.bin").is_file()]
    parts: dict[int, Path] = {}
    for d in src_dirs:
        for p in d.glob("model.bin.part*"):
            if (m := re.fullmatch(r"model\.bin\.part(\d+)", p.name)) and p.is_file():
                if int(m.group(1)) in parts:
                    raise Ct2FormatError(f"{p.name} found twice: {parts[int(m.group(1))]} and {p}")
                parts[int(m.group(1))] = p
    dirs = ", ".join(str(d) for d in src_dirs)
    if whole and parts or len(whole) > 1:
        raise Ct2FormatError(f"ambiguous: several model.bin / model.bin.partN sets in {dirs}")
    if parts:
        missing = sorted(set(range(1, max(parts) + 1)) - set(parts))
        if missing:
            raise Ct2FormatError(
                f"model.bin.part{missing[0]} is missing from {dirs}; install or copy every part"
            )
        pieces = [parts[i] for i in sorted(parts)]
    elif whole:
        pieces = whole
    else:
        raise Ct2FormatError(f"no model.bin or model.bin.partN in {dirs}")
    tokenizers = [d / "tokenizer.json" for d in src_dirs if (d / "tokenizer.json").is_file()]
    if not tokenizers:
        raise Ct2FormatError(f"no tokenizer.json beside the model in {dirs}")
    configs = [d / "config.json" for d in src_dirs if (d / "config.json").is_file()]
    return pieces, tokenizers[0], (configs[0] if configs else None)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_ct2_to_hf(
    src_dirs: Sequence[Path],
    dst_dir: Path,
    expected_sha256: Mapping[str, str] | None = None,
    checksum_fix: str = "re-download the model",
    origin: str | None = None,
) -> Path:
    """Write a complete HF Whisper folder at `dst_dir`, atomically (temp dir + rename).

    `dst_dir` must not exist. If another process completes the same `dst_dir` while we convert,
    its folder is kept and ours dropped (both came from the same files).
    """
    src_dirs = [Path(d) for d in src_dirs]
    if Path(dst_dir).exists():
        raise FileExistsError(f"{dst_dir} already exists; remove it or choose another output folder")
    pieces, tokenizer_path, config_path = find_ct2_files(src_dirs)
    model = read_ct2(pieces, expected_sha256, checksum_fix)
    sd = ct2_to_hf_state_dict(model)
    ct2_cfg = json.loads(config_path.read_text(encoding="utf-8")) if config_path else {}
    vocab_size = sd["model.decoder.embed_tokens.weight"].shape[0]
    tok_json, tokens = _tokenizer_with_timestamps(json.loads(tokenizer_path.read_text("utf-8")), vocab_size)
    config = _hf_config(model, sd, tokens, ct2_cfg)

    dst_dir = Path(dst_dir)
    dst_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_dir.parent / f".{dst_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors creates it owner-only
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", _generation_config(config, tokens, ct2_cfg))
        (tmp / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
        for name, obj in _tokenizer_files(tokens, config["num_mel_bins"]).items():
            _write_json(tmp / name, obj)
        source = {
            "format": "ctranslate2",
            "converter_version": CONVERTER_VERSION,
            "origin": origin,
            "binary_version": model.binary_version,
            "spec": model.spec,
            "spec_revision": model.revision,
            "files": [{"path": str(s.path), "size": s.size, "sha256": s.sha256} for s in model.sources],
            "tokenizer": str(tokenizer_path),
            "ct2_config": str(config_path) if config_path else None,
        }
        _write_json(tmp / SOURCE_FILE, source)  # written last: its presence marks a complete folder
        try:
            os.rename(tmp, dst_dir)
        except OSError:
            if not (dst_dir / SOURCE_FILE).is_file():
                raise
            shutil.rmtree(tmp)  # a concurrent conversion won the rename; its result is identical
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst_dir
