"""The weights' sha256: hashlib's digest of each file, cached by (path, size, mtime)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from batchscribe.weights import digest


def test_digest_follows_the_files_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    (model / "config.json").write_text("{}")  # not weights: not hashed
    each = hashlib.sha256(b"weights v1").hexdigest()
    expected = hashlib.sha256(f"model.safetensors\0{each}\n".encode()).hexdigest()
    assert digest.weights_sha256(model, cache) == expected
    calls: list[Path] = []
    real = digest._file_sha256
    monkeypatch.setattr(digest, "_file_sha256", lambda p: calls.append(p) or real(p))
    assert digest.weights_sha256(model, cache) == expected and calls == []  # from the cache
    (model / "model.safetensors").write_bytes(b"weights v2")  # new weights, same folder and name
    os.utime(model / "model.safetensors", ns=(1, 1))
    changed = digest.weights_sha256(model, cache)
    assert changed != expected and len(calls) == 1
    (model / "config.json").write_text('{"x": 1}')
    assert digest.weights_sha256(model, cache) == changed
