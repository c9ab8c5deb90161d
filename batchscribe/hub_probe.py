"""Whether the Hugging Face hub answers at all, asked once and briefly: huggingface_hub and
datasets retry an unreachable hub for ~30 s before failing (or before using a cached copy), so
the model resolver (weights/hub.py) and the dataset reader (audio/sources/hf_datasets.py) ask
this first."""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request

PROBE_SECONDS = 3.0  # one request to the hub's API; DNS and connect included


def unreachable(url: str, seconds: float = PROBE_SECONDS) -> str:
    """"" when the hub answers `url` at all (any HTTP status: a private repo's 401 is an answer),
    else why not. In a thread, since name resolution has no timeout of its own."""
    outcome: list[str] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=seconds).close()
            outcome.append("")
        except urllib.error.HTTPError:
            outcome.append("")
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, bad endpoint
            reason = getattr(exc, "reason", exc)
            # NOTE: a TLS failure is an answer too: huggingface_hub may trust a CA bundle
            # (REQUESTS_CA_BUNDLE, a proxy's) that urllib does not; let it try.
            outcome.append("" if isinstance(reason, ssl.SSLError) else f"{type(exc).__name__}: {reason}")

    thread = threading.Thread(target=probe, daemon=True, name="batchscribe-hub-probe")
    thread.start()
    thread.join(seconds + 0.5)
    return outcome[0] if outcome else f"no answer within {seconds:.0f} s"
