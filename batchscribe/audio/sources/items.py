"""The types every source shares: what an input item is, how inputs are read, and the error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchscribe.config import ConfigError


class SourceError(ValueError):
    """The input cannot be read as a whole; the message names the input, the problem and the fix."""


@dataclass(frozen=True)
class SourceOptions:
    """How inputs are read. Column names default to the Hugging Face datasets convention."""

    audio_column: str = "audio"
    id_column: str | None = None  # None: "id" when that column exists, else a derived id
    text_column: str | None = None  # None: the first of columns.REFERENCE_COLUMNS present, else no reference
    passthrough: tuple[str, ...] = ()  # columns copied into SourceItem.extra
    prompt_column: str | None = None  # each item's initial prompt (names, domain terms); null: none
    config: str | None = None  # datasets config name (hub ids and hub-style folders)
    split: str | None = None  # datasets split; needed only when a dataset has several
    streaming: bool = True  # datasets: stream rows instead of downloading/preparing first
    num_shards: int = 1
    shard_index: int = 0
    limit: int | None = None  # items of this shard, counted after sharding
    # Parquet audio bytes as views of Arrow's buffers instead of copies: for decoding in threads of
    # this process (GPU runs), where each copy holds the GIL. Copies cost decode processes less
    # memory (views keep whole Arrow batches alive until the pool copies them anyway).
    audio_views: bool = False
    # Folders never read as input (resolved absolute paths): the run's own output folder, so records
    # written inside a folder input are not read back as audio or Parquet input.
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "passthrough", tuple(self.passthrough))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        if self.num_shards < 1:
            raise ConfigError(f"num_shards={self.num_shards} must be >= 1")
        if not 0 <= self.shard_index < self.num_shards:
            raise ConfigError(
                f"shard_index={self.shard_index} is outside 0..{self.num_shards - 1}; "
                f"give --shard-index between 0 and --num-shards - 1"
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit={self.limit} would transcribe nothing; give a count >= 1, or None for every item")
        if not self.audio_column:
            raise ConfigError("audio_column is empty; name the column holding the audio")

    def prompt_identity(self) -> dict[str, str]:
        """The prompt column as the run config records it: only when set, so folders written
        before the option existed still resume."""
        return {} if self.prompt_column is None else {"prompt_column": self.prompt_column}


@dataclass(frozen=True)
class SourceItem:
    """One input item, audio still encoded.

    `audio_bytes` is the encoded file when the source stores bytes; otherwise `path` is where the
    audio lives (resolved against the Parquet file's or manifest's folder). When both are set,
    `path` is only the original file name recorded next to the bytes. Parquet's bytes are a
    read-only view of Arrow's buffer, not a copy (pickled as bytes).
    """

    id: str
    audio_bytes: bytes | memoryview | None
    path: str | None
    text: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    # Where the item came from, as stable as the input: an audio file's path relative to its folder
    # with the extension, a manifest's path as written, `<parquet file>:<row>`. It names a
    # duplicate id (`<id>#<origin>`), so the name does not depend on what else is listed.
    origin: str | None = field(default=None, compare=False)
    prompt: str | None = None  # the item's initial prompt (--prompt-column); None or "": none

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A memoryview cannot be pickled (to a decode process, or by Ray): send its bytes.
        data = bytes(self.audio_bytes) if isinstance(self.audio_bytes, memoryview) else self.audio_bytes
        return SourceItem, (self.id, data, self.path, self.text, self.extra, self.origin, self.prompt)
