"""Reading what `eval` compares: a run's record shards (predictions) and reference transcripts.

References come from any input `batchscribe run` accepts (through `audio.sources.iter_source`, so
ids are derived exactly as the run derived them), plus plain `id,text` JSONL/CSV files that have no
audio column. When no reference source is given, the `reference` field that `run --text-column`
writes into each record is used.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchscribe.audio.sources import SourceError, SourceOptions, iter_source
from batchscribe.audio.sources.columns import REFERENCE_COLUMNS
from batchscribe.output.formats import read_shard
from batchscribe.output.resume import inspect_output, writer_prefixes
from batchscribe.output.writers import SUMMARY_NAME

SHARD_SUFFIXES = (".jsonl", ".parquet")


class EvalInputError(ValueError):
    """Predictions or references cannot be read; the message names the input and the fix."""


@dataclass(frozen=True)
class Predictions:
    records: dict[str, dict[str, Any]]  # id -> record (first occurrence)
    files: tuple[Path, ...]
    duplicates: tuple[str, ...] = ()  # ids seen more than once (the first record is used)
    summary: dict[str, Any] | None = None  # the run's summary.json, when found


@dataclass(frozen=True)
class Reference:
    id: str
    text: str | None  # None: the source row has no reference text (listed, not scored)
    groups: dict[str, Any] = field(default_factory=dict)  # group column -> value
    source: str = ""  # the reference input this item came from


def shard_files(paths: Sequence[Path]) -> list[Path]:
    """Record files named by `paths`: files as given; folders -> their *.jsonl / *.parquet shards."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif path.is_dir() and any(path.glob("_manifest*.ndjson")):
            shards = _committed_shards(path)
            if not shards:
                raise EvalInputError(f"{path}: a run's folder that holds no committed records yet; rerun that "
                                     "`batchscribe run` command to transcribe them")
            found.extend(shards)
        elif path.is_dir():
            shards = sorted(p for p in path.rglob("*") if p.suffix in SHARD_SUFFIXES and p.is_file()
                            and not p.name.startswith("."))  # ".x.jsonl.tmp" are uncommitted shards
            if not shards:
                raise EvalInputError(f"{path}: no *.jsonl or *.parquet record shards; give a `batchscribe run` "
                                     f"output directory or record files")
            found.extend(shards)
        else:
            raise EvalInputError(f"{path}: no such file or directory; give a run's output directory")
    return found


def _committed_shards(folder: Path) -> list[Path]:
    """A run folder's committed shards, every writer's, read as a resume reads them: a file of the
    user's or an old copy an interrupted --retry-errors left is not a record shard of the run."""
    shards: list[Path] = []
    for prefix in writer_prefixes(folder):
        state = inspect_output(folder, "jsonl", prefix)  # the format only matters for writing
        if state.bad:
            name, why = state.bad[0]
            raise EvalInputError(f"{folder / name}: cannot be read as record shard ({why}); rerun that "
                                 "`batchscribe run` command: it moves a damaged shard aside and redoes its items")
        shards.extend(folder / e.shard for e in state.entries)
    return shards


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        return read_shard(path)
    except Exception as exc:  # json, pyarrow and OS errors: a damaged or foreign file
        raise EvalInputError(
            f"{path}: cannot be read as record shard ({type(exc).__name__}: {str(exc)[:200]}); if a run wrote "
            "it, rerun that `batchscribe run` command: it moves a damaged shard aside and redoes its items"
        ) from exc


def load_predictions(paths: Path | Sequence[Path]) -> Predictions:
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = shard_files(paths)
    records: dict[str, dict[str, Any]] = {}
    duplicates: list[str] = []
    for f in files:
        for line_no, rec in enumerate(_read_records(f), 1):
            if "id" not in rec:
                raise EvalInputError(f"{f}: record {line_no} has no `id`; these are not batchscribe records")
            rid = str(rec["id"])
            if rid in records:
                duplicates.append(rid)
            else:
                records[rid] = rec
    summary = None
    for path in map(Path, paths):
        folder = path if path.is_dir() else path.parent
        # summary.json, or summary-records-partXXXXXofYYYYY.json of one machine of a sharded run
        found = [folder / SUMMARY_NAME] if (folder / SUMMARY_NAME).is_file() else sorted(folder.glob("summary-*.json"))
        if found:
            summary = json.loads(found[0].read_text(encoding="utf-8"))
            break
    return Predictions(records, tuple(files), tuple(duplicates), summary)


def references_from_records(preds: Predictions, group_columns: Sequence[str]) -> list[Reference]:
    """The `reference` field a run writes when its input had a text column."""
    if not any("reference" in r for r in preds.records.values()):
        raise EvalInputError("the records carry no `reference` field; pass --references SOURCE (the run's "
                             "input) or re-run with --text-column")
    for col in group_columns:
        if not any(col in r for r in preds.records.values()):
            raise EvalInputError(f"group column {col!r} is in no record; pass it to `run --passthrough {col}`, "
                                 f"or give --references SOURCE that has the column")
    return [Reference(rid, rec.get("reference"), {c: rec.get(c) for c in group_columns}, "records")
            for rid, rec in preds.records.items()]


def load_references(
    inputs: Sequence[str],
    *,
    text_column: str | None = None,
    id_column: str | None = None,
    group_columns: Sequence[str] = (),
) -> list[Reference]:
    """Reference items of every input, in input order. Duplicate ids raise (joining would be ambiguous).
    `text_column` None: the first conventional reference column there (as `run` picks one)."""
    refs: list[Reference] = []
    seen: dict[str, str] = {}
    for inp in inputs:
        for ref in _read_one(inp, text_column, id_column, tuple(group_columns)):
            if ref.id in seen:
                raise EvalInputError(f"reference id {ref.id!r} occurs in {seen[ref.id]!r} and {inp!r}; "
                                     f"ids must be unique to join predictions by id (use --id-column)")
            seen[ref.id] = inp
            refs.append(ref)
    return refs


def _read_one(inp: str, text_column: str | None, id_column: str | None, groups: tuple[str, ...]) -> list[Reference]:
    opts = SourceOptions(id_column=id_column, text_column=text_column, passthrough=groups)
    try:
        return [Reference(it.id, it.text, dict(it.extra), inp) for it in iter_source([inp], opts)]
    except SourceError as exc:
        path = Path(inp)
        # A plain id/text table has no audio column, which `run` needs but references do not.
        if path.suffix.lower() in (".jsonl", ".csv", ".tsv") and "no audio path column" in str(exc):
            return _read_table(path, text_column, id_column or "id", groups)
        # group columns travel as passthrough columns; name the flag eval users know
        msg = str(exc).replace("passthrough column", "group column").replace("--passthrough", "--group")
        raise EvalInputError(f"references {inp!r}: {msg}") from exc


def _read_table(path: Path, text_column: str | None, id_column: str, groups: tuple[str, ...]) -> list[Reference]:
    if path.suffix.lower() == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    else:
        with path.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    out = []
    if text_column is None:
        text_column = next((c for c in REFERENCE_COLUMNS if rows and c in rows[0]), REFERENCE_COLUMNS[0])
    for i, row in enumerate(rows, 1):
        missing = [c for c in (id_column, text_column, *groups) if c not in row]
        if missing:
            raise EvalInputError(f"{path}: row {i} has no column(s) {', '.join(missing)}; available: "
                                 f"{', '.join(row)}; choose with --id-column / --text-column / --group")
        text = row[text_column]
        out.append(Reference(str(row[id_column]), None if text is None else str(text),
                             {c: row[c] for c in groups}, str(path)))
    return out
