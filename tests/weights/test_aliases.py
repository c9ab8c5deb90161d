"""Aliases: the pinned sha256 of a weight package is checked before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscribe.weights.aliases import ALIASES, Alias, PackagePart, convert_alias
from batchscribe.weights.ct2_format import ChecksumError
from tests.weights.helpers import installed_package_dirs


def test_checksum_mismatch_raises_before_writing(tmp_path: Path) -> None:
    real = ALIASES["tiny.en"]
    installed_package_dirs("tiny.en")
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
