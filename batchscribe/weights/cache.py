"""The converted-model cache: `<cache>/converted/<name>`, each folder written once by ct2_convert.

A cached folder is current when its SOURCE_FILE names this converter version (and, for an alias,
the pinned files): a hit then costs no hashing. Conversions of one target are serialised across
processes; correctness rests on ct2_convert's atomic rename, the lock only avoids duplicate work.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from batchscribe.weights.ct2_convert import CONVERTER_VERSION, SOURCE_FILE, convert_ct2_to_hf
from batchscribe.weights.ct2_format import find_ct2_files
from batchscribe.weights.hf_folder import is_hf_folder


def is_current(folder: Path, pinned: dict[str, str] | None) -> bool:
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
    """Serialise conversions of one target across processes so the work is done once."""
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


def convert_into_cache(
    src_dirs: list[Path], target: Path, pinned: dict[str, str] | None, fix: str, origin: str
) -> Path:
    """`target`, converted from `src_dirs` unless another process did it while we waited."""
    with _conversion_lock(target):
        if is_current(target, pinned):
            return target
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


def convert_ct2_folder(path: Path, cache: Path) -> Path:
    """The cached conversion of the CT2 folder at `path`, converting it on first use."""
    target = cache / "converted" / _ct2_cache_key(path)
    if is_current(target, None):
        return target
    fix = "re-export the CTranslate2 model"
    return convert_into_cache([path], target, None, fix, str(path.resolve()))
