"""What the command line needs that is neither typer nor rich: its examples and its small parsers.

Kept out of cli.py (the only module that imports typer and rich) so that it stays one screenful
of commands and options.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from batchscribe.config import ConfigError

DEFAULT_TEMPERATURES = "0,0.2,0.4,0.6,0.8,1.0"

# Plain click help (rich_markup_mode=None): at 80 columns rich's option table cut flags and
# kernel names and showed a <bool> metavar (issue 19). "\b" keeps click from rewrapping a
# paragraph; the lines stay under 78 columns.
RUN_EXAMPLES = """\
Examples:

\b
  # the bundled demo clips with the default model (tiny.en), offline
  batchscribe run --demo -o demo-out

\b
  # Parquet shards (audio struct {bytes, path}); a WER report from "text"
  batchscribe run 'data/train-*.parquet' -o out --format parquet \\
      --passthrough speaker_id

\b
  # a Hugging Face dataset (hub id or save_to_disk folder), first 100 rows
  batchscribe run openslr/librispeech_asr --config clean --split test \\
      --limit 100 -o out

\b
  # a folder of audio files (recursive) or a JSONL/CSV manifest
  batchscribe run recordings/ -o out --model base --language de
  batchscribe run manifest.jsonl -o out --max-errors 10

\b
  # one of 4 machines; rerunning the same command resumes where it stopped
  batchscribe run 'data/*.parquet' -o out --num-shards 4 --shard-index 0

\b
  # word timestamps, then subtitles (one .srt per item)
  batchscribe run recordings/ -o out --word-timestamps
  batchscribe export out --format srt -o subs
"""

EVAL_EXAMPLES = """\
Examples:

\b
  # score a run against the references its records carry
  batchscribe eval out -o report

\b
  # score against a reference source (any `run` input with id and text)
  batchscribe eval out --references data/test.parquet --group speaker_id \\
      -o report

\b
  # compare two models on the same rows (paired bootstrap CI)
  batchscribe eval out-base --references data/test.parquet \\
      --compare out-tiny -o base-vs-tiny
"""


def demo_manifest() -> Path:
    """The bundled clips' manifest (id, path, reference text), as a path on disk."""
    return Path(str(resources.files("batchscribe") / "demo" / "manifest.jsonl"))


def split_columns(values: list[str] | None) -> tuple[str, ...]:
    """--passthrough a,b --passthrough c -> (a, b, c), first occurrences kept."""
    names: list[str] = []
    for value in values or []:
        names.extend(v.strip() for v in value.split(",") if v.strip())
    return tuple(dict.fromkeys(names))


def parse_temperatures(spec: str) -> tuple[float, ...]:
    """--temperature "0,0.2" -> (0.0, 0.2)."""
    try:
        values = tuple(float(t) for t in spec.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"--temperature {spec!r} is not a comma-separated list of numbers; e.g. 0 or 0,0.2,0.4") from None
    return values


def audio_length(seconds: float) -> str:
    """Seconds of audio in the unit that reads at its size: "18.4 s", "12.8 min", "2.90 h"
    ("0.01 h" told a demo user nothing)."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
