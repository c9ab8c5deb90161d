"""Table rows (Parquet, manifests, datasets) -> SourceItems: the columns, and what an audio cell holds."""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscribe.audio.sources.items import SourceError, SourceItem, SourceOptions

log = logging.getLogger(__name__)

# Reference transcript columns by convention, in order of preference: datasets' audiofolder and
# LibriSpeech (text), FLEURS and many hub datasets (transcription), Common Voice (sentence),
# LJSpeech-style sets (normalized_text). Used when --text-column is not given.
REFERENCE_COLUMNS = ("text", "transcription", "sentence", "normalized_text")


@dataclass(frozen=True)
class Columns:
    audio: str
    id: str | None
    text: str | None
    passthrough: tuple[str, ...]
    prompt: str | None = None

    @property
    def needed(self) -> list[str]:
        names = [self.audio, self.id, self.text, self.prompt, *self.passthrough]
        return list(dict.fromkeys(n for n in names if n is not None))


def resolve_columns(
    available: Sequence[str], opts: SourceOptions, where: str, audio_column: str | None = None
) -> Columns:
    """Pick the columns to read; a missing one raises with the available names and the flag."""
    audio_column = audio_column or opts.audio_column

    def missing(what: str, name: str, flag: str) -> SourceError:
        return SourceError(
            f"{where}: no {what} column {name!r}; available columns: {', '.join(available)}; "
            f"choose one with {flag} NAME"
        )

    if audio_column not in available:
        raise missing("audio", audio_column, "--audio-column")
    for name, flag in ((opts.id_column, "--id-column"), (opts.text_column, "--text-column"),
                       (opts.prompt_column, "--prompt-column")):  # fmt: skip
        if name is not None and name not in available:
            raise missing(flag[2:].replace("-column", ""), name, flag)
    for name in opts.passthrough:
        if name not in available:
            raise missing("passthrough", name, "--passthrough")
    id_col = opts.id_column or ("id" if "id" in available else None)
    text_col = opts.text_column or next((c for c in REFERENCE_COLUMNS if c in available), None)
    return Columns(audio_column, id_col, text_col, opts.passthrough, opts.prompt_column)


def note_columns(cols: Columns, opts: SourceOptions) -> None:
    """Say which column became the reference when none was named (once per input: the CLI prints
    each distinct note once)."""
    if opts.text_column is None and cols.text is not None:
        log.info("reference text: column %r (a conventional name; --text-column NAME picks another)", cols.text)


def audio_value(value: Any, base_dir: Path | None) -> tuple[bytes | None, str | None]:
    """An audio cell (`{bytes, path}` struct, decoded `{array, sampling_rate}`, path string or raw
    bytes) -> (bytes, path)."""
    if isinstance(value, dict):
        data, where = value.get("bytes"), value.get("path")
        if data:
            return (data if isinstance(data, memoryview) else bytes(data)), where
        if value.get("array") is not None:
            return _samples_as_wav(value["array"], value.get("sampling_rate")), where
        return None, _resolve_path(where, base_dir) if where else None
    if isinstance(value, memoryview):
        return value, None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), None
    if isinstance(value, str) and value:
        return None, _resolve_path(value, base_dir)
    return None, None  # null or empty cell: the pool reports it as an item error


def _samples_as_wav(array: Any, rate: Any) -> bytes | None:
    """Decoded audio as `datasets` stores it -> a float WAV, which the decoder chain then reads,
    checks and resamples to 16 kHz like any other file. None (an error record) without a rate."""
    import numpy as np
    import soundfile as sf

    if not isinstance(rate, (int, float)) or rate <= 0:
        return None
    samples = np.asarray(array, dtype=np.float32)
    if samples.ndim == 2 and samples.shape[0] < samples.shape[1]:
        samples = samples.T  # datasets' [channels, samples] -> soundfile's [frames, channels]
    buf = io.BytesIO()
    sf.write(buf, samples, int(rate), format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _resolve_path(where: str, base_dir: Path | None) -> str:
    if "://" in where or base_dir is None or Path(where).is_absolute():
        return where
    return str(base_dir / where)


def make_item(row: dict[str, Any], cols: Columns, derived_id: str, base_dir: Path | None,
              origin: str | None = None) -> SourceItem:
    data, where = audio_value(row[cols.audio], base_dir)
    # A manifest's row may leave out a column others have (files.read_manifest): null
    raw_id = row.get(cols.id) if cols.id is not None else None
    raw_text = row.get(cols.text) if cols.text is not None else None
    return SourceItem(
        id=str(raw_id) if raw_id is not None and raw_id != "" else derived_id,
        audio_bytes=data,
        path=where,
        text=str(raw_text) if raw_text is not None else None,
        extra={name: row.get(name) for name in cols.passthrough},
        origin=origin or derived_id,
        prompt=prompt_value(row.get(cols.prompt)) if cols.prompt is not None else None,
    )


def prompt_value(value: Any) -> str | None:
    """A prompt cell: null, empty or blank means no prompt for that item (a column filled only
    where names are known is the common case, not an error)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None
