"""Real speech for the engine's GPU tests: the first 40 LibriSpeech test-other utterances."""

from __future__ import annotations

import io

import pytest


@pytest.fixture(scope="module")
def utterances(shared_data):
    import pyarrow.parquet as pq
    import soundfile as sf

    rows = pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet").to_pylist()[:40]
    return [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]
