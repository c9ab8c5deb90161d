"""`evaluate()`: join predictions to references by id, score every item, and gather the figures.

Nothing is dropped: a reference with no prediction or with an error record is scored against an
empty hypothesis (all deletions) and listed; predictions with no reference, references without
text and duplicate prediction ids are listed too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from itertools import repeat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchscribe.eval.inputs import (
    EvalInputError, Predictions, Reference, load_predictions, load_references, references_from_records,
)
from batchscribe.eval.normalize import NORMALIZERS, get_normalizer
from batchscribe.eval.wer import (
    DEFAULT_DURATION_EDGES,
    Counts,
    bootstrap_rates,
    bucket_order,
    duration_bucket,
    interval,
    score,
    sort_keys,
    total,
)
from batchscribe.output.writers import package_versions
from batchscribe.process_context import process_pool

SOURCE_GROUP = "source"  # group column meaning "the reference input the item came from"
# Normalising and aligning is ~0.5 ms an item: past this many, score in worker processes (a
# worker costs ~0.3 s to start; the run's report of 5,000 items took ~2.7 s in one process).
PARALLEL_ITEMS = 2000
CHUNK_ITEMS = 500
MAX_WORKERS = 16
_VERSIONED = ("batchscribe", "jiwer", "numpy", "pyarrow")


@dataclass(frozen=True)
class EvalSettings:
    predictions: tuple[str, ...]
    references: tuple[str, ...]
    text_column: str | None = None  # None: the first conventional reference column there
    id_column: str | None = None
    normalizer: str = "english"
    group_columns: tuple[str, ...] = ()
    worst_n: int = 20
    bootstrap: int = 1000
    seed: int = 0
    duration_edges: tuple[float, ...] = DEFAULT_DURATION_EDGES

    def __post_init__(self) -> None:
        if self.bootstrap < 0 or self.worst_n < 0:
            raise ValueError(f"bootstrap={self.bootstrap} and worst_n={self.worst_n} must be >= 0")
        edges = self.duration_edges
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] <= 0:
            raise ValueError(f"duration_edges={edges} must be positive seconds in increasing order")
        if self.normalizer not in NORMALIZERS:
            raise ValueError(f"unknown normalizer {self.normalizer!r}: choose one of {', '.join(NORMALIZERS)}")


@dataclass(frozen=True)
class Item:
    """One reference item, scored. status: ok | error (error record) | missing (no prediction)."""

    id: str
    status: str
    reference: str
    hypothesis: str
    ref_norm: str
    hyp_norm: str
    words: Counts
    chars: Counts
    duration: float | None = None
    groups: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    alignment: tuple[tuple[str, str | None, str | None], ...] = ()

    @property
    def wer(self) -> float:
        return self.words.rate


@dataclass(frozen=True)
class GroupRow:
    key: str
    items: int
    words: Counts
    chars: Counts

    @property
    def wer(self) -> float:
        return self.words.rate


@dataclass(frozen=True)
class Report:
    settings: EvalSettings
    items: tuple[Item, ...]
    wer: float
    cer: float
    ci: tuple[float, float] | None  # bootstrap 95% interval of corpus WER; None without resamples
    words: Counts
    chars: Counts
    groups: dict[str, tuple[GroupRow, ...]]  # group column -> rows
    durations: tuple[GroupRow, ...]
    unmatched_predictions: tuple[str, ...]  # prediction ids with no reference
    no_reference_text: tuple[str, ...]  # reference ids whose text is null
    duplicate_predictions: tuple[str, ...]
    model: Any = None
    run_summary: dict[str, Any] | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(i.id for i in self.items if i.status == "missing")

    @property
    def errors(self) -> tuple[Item, ...]:
        return tuple(i for i in self.items if i.status == "error")

    def worst(self, n: int | None = None) -> list[Item]:
        """Items by per-item WER, worst first (ties: more errors first, then id)."""
        n = self.settings.worst_n if n is None else n
        ranked = sorted(self.items, key=lambda i: (-i.wer, -i.words.errors, i.id))
        return [i for i in ranked if i.words.errors > 0][:n]


def evaluate(
    predictions: Path | str | Sequence[Path | str],
    references: Sequence[str] = (),
    *,
    text_column: str | None = None,
    id_column: str | None = None,
    normalizer: str = "english",
    group_columns: Sequence[str] = (),
    worst_n: int = 20,
    bootstrap: int = 1000,
    seed: int = 0,
    duration_edges: Sequence[float] = DEFAULT_DURATION_EDGES,
) -> Report:
    """Score a run's records against references (any `run` input; empty: the records' `reference`)."""
    pred_paths = [predictions] if isinstance(predictions, (str, Path)) else list(predictions)
    settings = EvalSettings(tuple(map(str, pred_paths)), tuple(map(str, references)), text_column, id_column,
                            normalizer, tuple(group_columns), worst_n, bootstrap, seed, tuple(duration_edges))
    get_normalizer(normalizer)  # an unknown name fails here, not in a worker
    preds = load_predictions([Path(p) for p in pred_paths])
    refs = _references(preds, settings)
    ref_ids = {r.id for r in refs}
    if settings.references and refs and preds.records and ref_ids.isdisjoint(preds.records):
        # Not a 100 % WER of all-missing items: the wrong file, or ids read from another column.
        raise EvalInputError(
            f"none of the {len(ref_ids)} reference ids matches one of the {len(preds.records)} records' ids "
            f"(references e.g. {min(ref_ids)!r}, records e.g. {min(preds.records)!r}); check that the references "
            "are those of this run's input, or name their id column with --id-column")
    items = _score_all([(ref, preds.records.get(ref.id)) for ref in refs if ref.text is not None], settings)
    return _assemble(settings, items, preds,
                     unmatched=tuple(i for i in preds.records if i not in ref_ids),
                     no_text=tuple(r.id for r in refs if r.text is None))


def _references(preds: Predictions, s: EvalSettings) -> list[Reference]:
    if not s.references:
        return references_from_records(preds, [c for c in s.group_columns if c != SOURCE_GROUP])
    # Group values the run passed through into its records win; the rest must be reference columns.
    in_records = {c for c in s.group_columns if any(c in r for r in preds.records.values())}
    wanted = [c for c in s.group_columns if c not in in_records and c != SOURCE_GROUP]
    return load_references(list(s.references), text_column=s.text_column, id_column=s.id_column,
                           group_columns=wanted)


def _score_all(todo: list[tuple[Reference, dict[str, Any] | None]], s: EvalSettings) -> tuple[Item, ...]:
    """Every (reference, record) pair scored, in order: in this process, or over worker processes
    when there are many (each gets only the record fields scoring reads, not its segments)."""
    workers = min(MAX_WORKERS, os.cpu_count() or 1, -(-len(todo) // CHUNK_ITEMS))
    if len(todo) < PARALLEL_ITEMS or workers < 2:
        return _score_chunk(todo, s.normalizer, s.group_columns)
    keep = {"text", "error", "duration", *s.group_columns}
    slim = [(ref, None if rec is None else {k: v for k, v in rec.items() if k in keep}) for ref, rec in todo]
    chunks = [slim[i : i + CHUNK_ITEMS] for i in range(0, len(slim), CHUNK_ITEMS)]
    with process_pool(workers, ["batchscribe.eval.report"]) as pool:
        parts = pool.map(_score_chunk, chunks, repeat(s.normalizer), repeat(s.group_columns))
        return tuple(item for part in parts for item in part)


def _score_chunk(todo: list[tuple[Reference, dict[str, Any] | None]], normalizer: str,
                 group_columns: Sequence[str]) -> tuple[Item, ...]:  # fmt: skip
    normalize = get_normalizer(normalizer)
    return tuple(_score_item(ref, rec, normalize, group_columns) for ref, rec in todo)


def _score_item(ref: Reference, rec: dict[str, Any] | None, normalize: Any, group_columns: Sequence[str]) -> Item:
    assert ref.text is not None
    if rec is None:
        status, hyp, err = "missing", "", None
    elif rec.get("error") is not None or rec.get("text") is None:
        status, hyp, err = "error", "", str(rec.get("error") or "record has neither text nor error")
    else:
        status, hyp, err = "ok", str(rec["text"]), None
    ref_norm, hyp_norm = normalize(ref.text), normalize(hyp)
    scored = score(ref_norm, hyp_norm)
    groups = {}
    for col in group_columns:  # the record's value (a run passthrough) wins over the reference's
        if col == SOURCE_GROUP:
            groups[col] = ref.source
        elif rec is not None and col in rec:
            groups[col] = rec[col]
        else:
            groups[col] = ref.groups.get(col)
    duration = rec.get("duration") if rec is not None else None
    return Item(ref.id, status, ref.text, hyp, ref_norm, hyp_norm, scored.words, scored.chars,
                float(duration) if duration is not None else None, groups, err, scored.alignment)


def _assemble(s: EvalSettings, items: tuple[Item, ...], preds: Predictions, unmatched: tuple[str, ...],
              no_text: tuple[str, ...]) -> Report:
    words, chars = total(i.words for i in items), total(i.chars for i in items)
    ci = None
    if s.bootstrap > 0 and items and words.n_ref > 0:
        errors = np.array([i.words.errors for i in items], dtype=np.int64)  # [items]
        n_ref = np.array([i.words.n_ref for i in items], dtype=np.int64)  # [items]
        samples = bootstrap_rates(errors, n_ref, s.bootstrap, s.seed)
        finite = samples[np.isfinite(samples)]  # a resample of only empty references has no rate
        ci = interval(finite) if finite.size else None
    groups = {col: _rows([str(i.groups.get(col)) for i in items], items) for col in s.group_columns}
    buckets = [duration_bucket(i.duration, s.duration_edges) for i in items]
    order = bucket_order(s.duration_edges)
    durations = _rows(buckets, items, key=lambda k: order.index(k))
    summary = preds.summary or {}
    return Report(s, items, words.rate if words.n_ref else math.nan, chars.rate if chars.n_ref else math.nan,
                  ci, words, chars, groups, durations, unmatched, no_text, preds.duplicates,
                  model=summary.get("model"), run_summary=preds.summary, versions=package_versions(_VERSIONED))


def _rows(keys: list[str], items: Sequence[Item], key: Any = None) -> tuple[GroupRow, ...]:
    acc: dict[str, list[Item]] = {}
    for k, item in zip(keys, items):
        acc.setdefault(k, []).append(item)
    return tuple(GroupRow(k, len(acc[k]), total(i.words for i in acc[k]), total(i.chars for i in acc[k]))
                 for k in sort_keys(acc, key))
