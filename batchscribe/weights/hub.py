"""A Hugging Face hub id -> its snapshot folder: the local HF cache first, then one short try.

batchscribe runs offline, so the cache is read before the network, and the network is asked at
most once, briefly: huggingface_hub retries an unreachable hub for ~30 s, printing "Name or service
not known" on the way, before a mistyped name fails (issue 19).
"""

from __future__ import annotations

from pathlib import Path

from batchscribe.hub_probe import unreachable as _unreachable

# Only these files are fetched from the hub: never pickled checkpoints (*.bin, *.pt, *.ckpt).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "tokenizer*"]


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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
