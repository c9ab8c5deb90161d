"""Fixtures of the eval tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eval.sample_runs import write_refs


@pytest.fixture()
def refs(tmp_path: Path) -> Path:
    """The references of tests/eval/sample_runs.py as refs.jsonl."""
    return write_refs(tmp_path / "refs.jsonl")
