"""weights/hub.py: the HF cache first, then one short try of an unreachable hub (no network here)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.weights.test_resolve import _run_python

RESOLVE = """
    import time
    from batchscribe.weights.resolve import ModelNotFoundError, resolve_model
    start = time.perf_counter()
    try:
        resolve_model("someone/whisper-missing", cache_dir={cache!r})
    except ModelNotFoundError as exc:
        print(f"{{time.perf_counter() - start:.2f}}")
        print(str(exc).splitlines()[0])
"""


@pytest.fixture
def silent_hub():
    """A hub endpoint that accepts connections and never answers (a black-holed proxy or firewall)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def _resolve_missing(tmp_path: Path, env: dict[str, str]) -> tuple[float, str]:
    result = _run_python(RESOLVE.format(cache=str(tmp_path / "bs")), {"HF_HUB_CACHE": str(tmp_path / "hub"), **env})
    assert result.returncode == 0, result.stderr
    seconds, message = result.stdout.strip().splitlines()
    return float(seconds), message


def test_a_silent_hub_is_asked_once_briefly(tmp_path: Path, silent_hub: str) -> None:
    seconds, message = _resolve_missing(tmp_path, {"HF_ENDPOINT": silent_hub})
    assert seconds < 5.0, seconds  # huggingface_hub alone was still retrying here after 120 s
    assert "'someone/whisper-missing'" in message and "unreachable" in message and silent_hub in message
    assert "hf download someone/whisper-missing" in message and "local model folder" in message


def test_an_unreachable_hub_fails_fast(tmp_path: Path) -> None:
    """The real endpoint, which this machine cannot reach (any name resolution or connect error)."""
    start = time.perf_counter()
    seconds, message = _resolve_missing(tmp_path, {})
    if "unreachable" not in message:
        pytest.skip(f"the hub is reachable from here: {message}")
    assert seconds < 5.0 and time.perf_counter() - start < 15.0


def test_offline_mode_fails_at_once_naming_the_fix(tmp_path: Path, silent_hub: str) -> None:
    seconds, message = _resolve_missing(tmp_path, {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": silent_hub})
    assert seconds < 1.0
    assert "HF_HUB_OFFLINE is set" in message and "unset HF_HUB_OFFLINE" in message
    assert str(tmp_path / "hub") in message  # the cache it looked in
