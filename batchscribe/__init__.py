"""batchscribe: offline batch transcription with Whisper-family models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchscribe.version import __version__

__all__ = ["Transcriber", "DecodeOptions", "__version__"]

if TYPE_CHECKING:
    from batchscribe.api import Transcriber
    from batchscribe.config import DecodeOptions


def __getattr__(name: str) -> Any:
    # Lazy: `import batchscribe` stays cheap (the CLI's --help must not load torch).
    if name == "Transcriber":
        from batchscribe.api import Transcriber

        return Transcriber
    if name == "DecodeOptions":
        from batchscribe.config import DecodeOptions

        return DecodeOptions
    raise AttributeError(name)
