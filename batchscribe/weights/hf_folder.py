"""A Hugging Face Whisper folder: recognise it, refuse pickled checkpoints, load its state dict."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


class ModelFormatError(ValueError):
    """A folder that exists but cannot be loaded (not HF/CT2, or pickle-only weights)."""


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _pickle_files(path: Path) -> list[str]:
    names = ("pytorch_model.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth", "*.ckpt")
    return sorted({p.name for pattern in names for p in path.glob(pattern)})


def require_hf_folder(path: Path) -> Path:
    """`path` if it is an HF folder; else ModelFormatError (never unpickles: that can run code)."""
    if is_hf_folder(path):
        return path
    pickles = _pickle_files(path)
    if pickles:
        raise ModelFormatError(
            f"{path} holds only pickled weights ({', '.join(pickles)}); batchscribe loads safetensors only "
            "(unpickling can run arbitrary code). Convert it: WhisperForConditionalGeneration."
            "from_pretrained(path).save_pretrained(out, safe_serialization=True), then pass out"
        )
    raise ModelFormatError(
        f"{path} is neither a Hugging Face Whisper folder (config.json + *.safetensors) nor a "
        "CTranslate2 folder (model.bin or model.bin.partN + tokenizer.json); pass one of those"
    )


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """HF parameter names -> CPU tensors in the stored dtype; safetensors only, shards supported."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        require_hf_folder(folder)  # raises with the pickle or not-a-model message
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(folder / shard)))
    # Checkpoints saved from WhisperModel (not ...ForConditionalGeneration) lack the "model." prefix.
    state = {(f"model.{k}" if k.startswith(("encoder.", "decoder.")) else k): v for k, v in state.items()}
    if "model.decoder.embed_tokens.weight" not in state:
        raise ModelFormatError(f"{folder}: no model.decoder.embed_tokens.weight; not a Whisper checkpoint")
    # Whisper ties the output projection to the token embedding; checkpoints usually omit it.
    state.setdefault("proj_out.weight", state["model.decoder.embed_tokens.weight"])
    return state
