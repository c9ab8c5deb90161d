"""Reading CTranslate2 (faster-whisper) Whisper models: which files, and the layout of `model.bin`.

We parse `model.bin` ourselves so that ctranslate2 need not be installed. The layout (see
CTranslate2's `python/ctranslate2/specs/model_spec.py` writer and `src/models/model.cc` reader):
little-endian, no padding; `u32 binary_version`; from v2 a spec name string and `u32 revision`;
`u32 n_variables`, each `name, u8 rank, u32 dims[rank], u8 dtype, u32 n_bytes, data`; from v3
`u32 n_aliases` and (alias, target) string pairs. A string is `u16 length` counting its NUL.
Before v4 the dtype byte is an item size and the u32 counts items, not bytes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch

SUPPORTED_BINARY_VERSION = 6

# CTranslate2 DataType ids (binary_version >= 4).
_DTYPES: dict[int, torch.dtype] = {
    0: torch.float32,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.float16,
    5: torch.bfloat16,
}
# Before v4 the byte is an item size; CTranslate2 resolved it with this (lossy) table.
_DTYPES_BY_ITEM_SIZE: dict[int, torch.dtype] = {4: torch.float32, 2: torch.int16, 1: torch.int8}


class Ct2FormatError(ValueError):
    """A model.bin that cannot be read or converted; the message names the file and the problem."""


class ChecksumError(ValueError):
    """A model file whose sha256 differs from the pinned value."""

    def __init__(self, path: Path, expected: str, actual: str, fix: str) -> None:
        super().__init__(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}. "
            f"The file is corrupt or not the release this version of batchscribe pins. Fix: {fix}"
        )


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class Ct2Model:
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, torch.Tensor]  # CPU tensors, views into the file buffer
    aliases: dict[str, str]  # alias -> target variable name
    sources: tuple[SourceFile, ...]

    def scalar(self, name: str, default: int) -> int:
        """A structure scalar (num_heads, pre_norm, ...), or `default` when the spec omits it."""
        value = self.variables.get(name)
        return default if value is None else int(value.reshape(-1)[0].item())

    def layer_count(self, side: str) -> int:
        pattern = re.compile(rf"^{side}/layer_(\d+)/")
        found = {int(m.group(1)) for name in self.variables if (m := pattern.match(name))}
        if found != set(range(len(found))) or not found:
            raise Ct2FormatError(f"{side} layers are missing or not numbered 0..n-1: {sorted(found)}")
        return len(found)


def is_ct2_folder(path: Path) -> bool:
    return (path / "model.bin").is_file() or any(path.glob("model.bin.part*"))


def find_ct2_files(src_dirs: Sequence[Path]) -> tuple[list[Path], Path, Path | None]:
    """(model pieces in order, tokenizer.json, CT2 config.json or None) across `src_dirs`."""
    whole = [d / "model.bin" for d in src_dirs if (d / "model.bin").is_file()]
    parts: dict[int, Path] = {}
    for d in src_dirs:
        for p in d.glob("model.bin.part*"):
            if (m := re.fullmatch(r"model\.bin\.part(\d+)", p.name)) and p.is_file():
                if int(m.group(1)) in parts:
                    raise Ct2FormatError(f"{p.name} found twice: {parts[int(m.group(1))]} and {p}")
                parts[int(m.group(1))] = p
    dirs = ", ".join(str(d) for d in src_dirs)
    if whole and parts or len(whole) > 1:
        raise Ct2FormatError(f"ambiguous: several model.bin / model.bin.partN sets in {dirs}")
    if parts:
        missing = sorted(set(range(1, max(parts) + 1)) - set(parts))
        if missing:
            raise Ct2FormatError(
                f"model.bin.part{missing[0]} is missing from {dirs}; install or copy every part"
            )
        pieces = [parts[i] for i in sorted(parts)]
    elif whole:
        pieces = whole
    else:
        raise Ct2FormatError(f"no model.bin or model.bin.partN in {dirs}")
    tokenizers = [d / "tokenizer.json" for d in src_dirs if (d / "tokenizer.json").is_file()]
    if not tokenizers:
        raise Ct2FormatError(f"no tokenizer.json beside the model in {dirs}")
    configs = [d / "config.json" for d in src_dirs if (d / "config.json").is_file()]
    return pieces, tokenizers[0], (configs[0] if configs else None)


def _read_and_hash(paths: Sequence[Path]) -> tuple[bytearray, tuple[SourceFile, ...]]:
    buf = bytearray()
    sources = []
    for path in paths:
        digest = hashlib.sha256()
        start = len(buf)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
                buf += chunk
        sources.append(SourceFile(Path(path), len(buf) - start, digest.hexdigest()))
    return buf, tuple(sources)


class _Cursor:
    def __init__(self, buf: bytearray, where: str) -> None:
        self.buf, self.pos, self.where = buf, 0, where

    def take(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.buf):
            raise Ct2FormatError(
                f"{self.where} is truncated: needed {n} bytes at offset {start}, file has "
                f"{len(self.buf)}; a model.bin.partN piece is probably missing or incomplete"
            )
        self.pos += n
        return start

    def uint(self, n: int) -> int:
        start = self.take(n)
        return int.from_bytes(self.buf[start : start + n], "little")

    def string(self) -> str:
        n = self.uint(2)
        start = self.take(n)
        return bytes(self.buf[start : start + n]).split(b"\0", 1)[0].decode("utf-8")


def _read_variable(cur: _Cursor, version: int) -> tuple[str, torch.Tensor]:
    name = cur.string()
    shape = [cur.uint(4) for _ in range(cur.uint(1))]
    if version >= 4:
        code = cur.uint(1)
        if code not in _DTYPES:
            raise Ct2FormatError(f"{cur.where}: variable {name} has unknown dtype id {code}")
        dtype, n_bytes = _DTYPES[code], cur.uint(4)
    else:
        size = cur.uint(1)
        if size not in _DTYPES_BY_ITEM_SIZE:
            raise Ct2FormatError(f"{cur.where}: variable {name} has unknown item size {size}")
        dtype = _DTYPES_BY_ITEM_SIZE[size]
        n_bytes = cur.uint(4) * size
    count = 1
    for d in shape:
        count *= d
    if n_bytes != count * dtype.itemsize:
        raise Ct2FormatError(f"{cur.where}: variable {name} {shape} {dtype} has {n_bytes} bytes")
    start = cur.take(n_bytes)
    if not count:
        return name, torch.empty(shape, dtype=dtype)
    # A view into the buffer: no copy until ct2_tensors clones what it keeps.
    return name, torch.frombuffer(cur.buf, dtype=dtype, count=count, offset=start).view(shape)


def read_ct2(
    paths: Sequence[Path],
    expected_sha256: Mapping[str, str] | None = None,
    checksum_fix: str = "re-download the model",
) -> Ct2Model:
    """Parse `model.bin`, or its `model.bin.partN` pieces concatenated in the order given.

    `expected_sha256` maps a file name to its pinned hex digest; a mismatch raises ChecksumError
    before anything is parsed.
    """
    buf, sources = _read_and_hash(paths)
    for src in sources:
        want = (expected_sha256 or {}).get(src.path.name)
        if want is not None and want != src.sha256:
            raise ChecksumError(src.path, want, src.sha256, checksum_fix)
    where = " + ".join(str(p) for p in paths)
    cur = _Cursor(buf, where)
    version = cur.uint(4)
    if not 1 <= version <= SUPPORTED_BINARY_VERSION:
        raise Ct2FormatError(
            f"{where}: binary_version {version} is not supported (1..{SUPPORTED_BINARY_VERSION}); "
            "re-export the model with a CTranslate2 release that writes version 6"
        )
    spec, revision = (cur.string(), cur.uint(4)) if version >= 2 else ("", 1)
    if spec not in ("", "WhisperSpec"):
        raise Ct2FormatError(f"{where}: spec {spec!r} is not a Whisper model (WhisperSpec)")
    variables = dict(_read_variable(cur, version) for _ in range(cur.uint(4)))
    aliases: dict[str, str] = {}
    if version >= 3:
        for _ in range(cur.uint(4)):
            alias = cur.string()
            aliases[alias] = cur.string()
    if cur.pos != len(buf):
        raise Ct2FormatError(f"{where}: {len(buf) - cur.pos} trailing bytes after the aliases")
    return Ct2Model(version, spec or "WhisperSpec", revision, variables, aliases, sources)
