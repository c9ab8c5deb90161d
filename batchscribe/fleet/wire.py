"""The job a --gpus parent hands each child on its stdin: one JSON line (inputs, output folder,
RunOptions). JSON, not a pickle: the package unpickles nothing (tests/system/test_safety.py), and
the options are plain values (strings, numbers, booleans, tuples, a cache path)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchscribe.audio.sources import SourceOptions
from batchscribe.config import DecodeOptions, EngineOptions
from batchscribe.run import RunOptions


def encode_job(inputs: Sequence[str], output_dir: Path, opts: RunOptions) -> bytes:
    options = dataclasses.asdict(opts)
    options["cache_dir"] = None if opts.cache_dir is None else str(opts.cache_dir)
    return (json.dumps({"inputs": list(inputs), "output": str(output_dir), "options": options}) + "\n").encode()


def decode_job(line: bytes) -> tuple[list[str], Path, RunOptions]:
    job = json.loads(line)
    options = {k: _tuples(v) for k, v in job["options"].items()}
    options["engine"] = EngineOptions(**options["engine"])
    options["decode"] = DecodeOptions(**options["decode"])
    options["source"] = SourceOptions(**options["source"])
    if options["cache_dir"] is not None:
        options["cache_dir"] = Path(options["cache_dir"])
    return list(job["inputs"]), Path(job["output"]), RunOptions(**options)


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples the frozen options hold (they are hashed: engines are keyed
    by DecodeOptions)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value
