"""Fixtures of the decode tests: dr_flac (miniaudio) present, or made to look absent."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def dr_flac() -> Iterator[None]:
    """miniaudio with the ma_dr_flac_* API, and a fresh import probe before and after the test."""
    pytest.importorskip("miniaudio", minversion="1.70")
    from batchscribe.audio.decode.dr_flac import dr_flac_api

    dr_flac_api.cache_clear()
    yield
    dr_flac_api.cache_clear()


@pytest.fixture
def no_miniaudio(monkeypatch: pytest.MonkeyPatch, dr_flac: None) -> None:
    """`import miniaudio` raises ImportError, as when it is not installed."""
    monkeypatch.setitem(sys.modules, "miniaudio", None)
