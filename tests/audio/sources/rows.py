"""Checks shared by the source tests: items against the reference rows."""

from __future__ import annotations

from pathlib import Path

from batchscribe.audio.sources import SourceItem


def payload(item: SourceItem) -> bytes:
    if item.audio_bytes is not None:
        return item.audio_bytes
    assert item.path is not None
    return Path(item.path).read_bytes()


def assert_same_rows(items: list[SourceItem], reference: list[dict]) -> None:
    assert [i.id for i in items] == [r["id"] for r in reference]
    assert [i.text for i in items] == [r["text"] for r in reference]
    for item, row in zip(items, reference):
        assert payload(item) == row["audio"]["bytes"], item.id
