"""The sha256 of a model's weights: what pins a run's records to the checkpoint that made them.

New weights written into the same model folder change no path or name, only this. Hashing a
large-v3 checkpoint takes seconds, so each file's digest is cached by (path, size, mtime) in
`<cache>/weights_sha256.json`; a file rewritten in place changes its size or mtime and is hashed
again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

_CACHE_NAME = "weights_sha256.json"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files `load_state_dict` reads (every *.safetensors in the folder)."""
    return sorted(Path(folder).glob("*.safetensors"))


def weights_sha256(folder: Path, cache_dir: Path | None = None) -> str:
    """One sha256 over each weight file's name and sha256, in name order."""
    cache = _load_cache(cache_dir)
    combined = hashlib.sha256()
    changed = False
    for path in weight_files(folder):
        stat = path.stat()
        key = str(path.resolve())
        hit = cache.get(key)
        if not (isinstance(hit, dict) and hit.get("size") == stat.st_size and hit.get("mtime_ns") == stat.st_mtime_ns):
            hit = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _file_sha256(path)}
            cache[key], changed = hit, True
        combined.update(f"{path.name}\0{hit['sha256']}\n".encode())
    if changed and cache_dir is not None:
        # Entries of files that are gone (a temporary model copy) would only grow the cache.
        _save_cache(cache_dir, {k: v for k, v in cache.items() if os.path.exists(k)})
    return combined.hexdigest()


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _load_cache(cache_dir: Path | None) -> dict[str, object]:
    if cache_dir is None:
        return {}
    try:
        data = json.loads((Path(cache_dir) / _CACHE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent or damaged: hash again
    return data if isinstance(data, dict) else {}


def _save_cache(cache_dir: Path, cache: dict[str, object]) -> None:
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        # A unique temp name: runs sharing the cache may save at once; the last rename wins.
        fd, tmp = tempfile.mkstemp(prefix=f".{_CACHE_NAME}.", suffix=".tmp", dir=cache_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(cache, f)
        os.replace(tmp, Path(cache_dir) / _CACHE_NAME)
    except OSError:
        pass  # a read-only cache only costs hashing again next time
