"""Exact conversion of a CTranslate2 (faster-whisper) Whisper model to a Hugging Face folder.

The folder holds the fp16 weights bit for bit (ct2_tensors) plus the config, generation config,
tokenizer and preprocessor files transformers needs to load it (ct2_configs). It is written
atomically: a temp folder renamed into place, SOURCE_FILE written last to mark it complete.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from safetensors.torch import save_file

from batchscribe.bpe_merges import restore_missing_merges
from batchscribe.weights.ct2_configs import add_timestamp_tokens, generation_config, hf_config, tokenizer_files
from batchscribe.weights.ct2_format import Ct2Model, find_ct2_files, read_ct2
from batchscribe.weights.ct2_tensors import ct2_to_hf_state_dict

# 2: tokenizer.json with the BPE merges the packages lost put back (batchscribe/bpe_merges.py).
CONVERTER_VERSION = 2  # bump when the written folder changes; cached conversions are then redone
SOURCE_FILE = "batchscribe_source.json"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _source_record(model: Ct2Model, origin: str | None, tokenizer: Path, ct2_config: Path | None) -> dict:
    """What a cached conversion was made from and by which converter (read back by weights.cache)."""
    return {
        "format": "ctranslate2",
        "converter_version": CONVERTER_VERSION,
        "origin": origin,
        "binary_version": model.binary_version,
        "spec": model.spec,
        "spec_revision": model.revision,
        "files": [{"path": str(s.path), "size": s.size, "sha256": s.sha256} for s in model.sources],
        "tokenizer": str(tokenizer),
        "ct2_config": str(ct2_config) if ct2_config else None,
    }


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
    tok_json, tokens = add_timestamp_tokens(json.loads(tokenizer_path.read_text("utf-8")), vocab_size)
    restore_missing_merges(tok_json)
    config = hf_config(model, sd, tokens, ct2_cfg)

    dst_dir = Path(dst_dir)
    dst_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_dir.parent / f".{dst_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors creates it owner-only
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation_config(config, tokens, ct2_cfg))
        (tmp / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
        for name, obj in tokenizer_files(tokens, config["num_mel_bins"]).items():
            _write_json(tmp / name, obj)
        source = _source_record(model, origin, tokenizer_path, config_path)
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
