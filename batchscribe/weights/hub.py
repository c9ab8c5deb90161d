"""A Hugging Face hub id -> its snapshot folder: the local HF cache first, then one short try.

batchscribe runs offline, so the cache is read before the network, and the network is asked at
most once, briefly: huggingface_hub retries an unreachable hub for ~30 s, printing "Name or service
not known" on the way, before a mistyped name fails (issue 19).
"""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

# Only these files are fetched from the hub: never pickled checkpoints (*.bin, *.pt, *.ckpt).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "tokenizer*"]
PROBE_SECONDS = 3.0  # one request to the hub's API; DNS and connect included


def hub_snapshot(repo_id: str) -> tuple[Path | None, str]:
    """(snapshot folder, "") or (None, why not, with the fix)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=True)), ""
    except HFValidationError as exc:
        return None, f"not a valid hub id ({_first_line(exc)})"
    except OSError:  # LocalEntryNotFoundError: not in the cache; ask the hub below
        pass
    if constants.HF_HUB_OFFLINE:
        return None, (f"HF_HUB_OFFLINE is set and it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                      f"download it where the hub is reachable (hf download {repo_id}) or unset HF_HUB_OFFLINE")  # fmt: skip
    unreachable = _unreachable(f"{constants.ENDPOINT.rstrip('/')}/api/models/{repo_id}")
    if unreachable:
        return None, (f"it is not in the Hugging Face cache and the hub ({constants.ENDPOINT}) is unreachable "
                      f"({unreachable}); download it where the hub is reachable (hf download {repo_id}), "
                      "or pass a local model folder")  # fmt: skip
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS)), ""
    except (HFValidationError, OSError) as exc:  # OSError covers HTTP errors and unknown repos
        return None, f"{type(exc).__name__}: {_first_line(exc)}"


def _unreachable(url: str, seconds: float = PROBE_SECONDS) -> str:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
