"""hub_probe.py: what counts as an unreachable hub."""

from __future__ import annotations

import socket

import pytest


def test_only_network_failures_count_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any HTTP answer (a private repo's 401) or TLS trouble (a CA bundle only huggingface_hub is
    told of) means the hub is there: snapshot_download then tries, with its own settings."""
    import ssl
    import urllib.error
    import urllib.request

    from batchscribe import hub_probe

    def failing(error: Exception):
        def urlopen(*args, **kwargs):
            raise error
        return urlopen

    cases = [
        (urllib.error.HTTPError("u", 401, "Unauthorized", {}, None), ""),
        (urllib.error.URLError(ssl.SSLCertVerificationError("self-signed certificate")), ""),
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), "Name or service not known"),
        (ConnectionRefusedError(111, "Connection refused"), "Connection refused"),
    ]
    for error, expected in cases:
        monkeypatch.setattr(urllib.request, "urlopen", failing(error))
        got = hub_probe.unreachable("https://hub.invalid/api/models/a/b", seconds=1.0)
        assert (got == "") if expected == "" else (expected in got), (error, got)
