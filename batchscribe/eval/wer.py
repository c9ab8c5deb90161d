"""Error counts with jiwer, corpus sums, breakdowns and bootstrap intervals.

Corpus WER is sum(S + D + I) / sum(reference words) over items, which is what
`jiwer.process_words(all_refs, all_hyps).wer` gives; per-item counts are kept so that groups,
bootstrap resamples and paired comparisons are sums over the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import jiwer
import numpy as np

DEFAULT_DURATION_EDGES: tuple[float, ...] = (2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
_OPS = {"equal": "=", "substitute": "S", "delete": "D", "insert": "I"}


@dataclass(frozen=True)
class Counts:
    """Edit counts of one item or a sum of items (words or characters)."""

    hits: int = 0
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def n_ref(self) -> int:
        return self.hits + self.substitutions + self.deletions

    @property
    def rate(self) -> float:
        """errors / reference length; an empty reference gives 0 (no errors) or inf (insertions)."""
        if self.n_ref:
            return self.errors / self.n_ref
        return math.inf if self.errors else 0.0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.hits + other.hits, self.substitutions + other.substitutions,
                      self.deletions + other.deletions, self.insertions + other.insertions)


def total(counts: Iterable[Counts]) -> Counts:
    out = Counts()
    for c in counts:
        out = out + c
    return out


@dataclass(frozen=True)
class Scored:
    words: Counts
    chars: Counts
    alignment: tuple[tuple[str, str | None, str | None], ...]  # (op "=", "S", "D", "I"; ref word; hyp word)


def score(ref: str, hyp: str) -> Scored:
    """Counts for one normalised reference/hypothesis pair (jiwer's default word/char transforms)."""
    w = jiwer.process_words(ref, hyp)
    c = jiwer.process_characters(ref, hyp)
    ref_words, hyp_words = w.references[0], w.hypotheses[0]
    align: list[tuple[str, str | None, str | None]] = []
    for chunk in w.alignments[0]:
        op = _OPS[chunk.type]
        # '=' and 'S' chunks span as many words on both sides; 'D' only reference, 'I' only hypothesis words
        n = max(chunk.ref_end_idx - chunk.ref_start_idx, chunk.hyp_end_idx - chunk.hyp_start_idx)
        for k in range(n):
            r = ref_words[chunk.ref_start_idx + k] if op != "I" else None
            h = hyp_words[chunk.hyp_start_idx + k] if op != "D" else None
            align.append((op, r, h))
    return Scored(
        Counts(w.hits, w.substitutions, w.deletions, w.insertions),
        Counts(c.hits, c.substitutions, c.deletions, c.insertions),
        tuple(align),
    )


def aligned_lines(alignment: Sequence[tuple[str, str | None, str | None]]) -> tuple[str, str, str]:
    """REF / HYP / ops lines padded so columns line up (jiwer's visualize_alignment layout)."""
    refs, hyps, ops = [], [], []
    for op, r, h in alignment:
        r, h = r or "*" * len(h or ""), h or "*" * len(r or "")
        width = max(len(r), len(h))
        refs.append(r.ljust(width))
        hyps.append(h.ljust(width))
        ops.append((" " if op == "=" else op).ljust(width))
    return " ".join(refs), " ".join(hyps), " ".join(ops).rstrip()


def _resample_chunks(n_items: int, n_resamples: int, seed: int, chunk_cells: int) -> Iterator[np.ndarray]:
    """Item indices of each resample (with replacement), in chunks of [rows, n_items].

    One generator draws every chunk in turn, so the resamples do not depend on the chunk size.
    Chunks bound memory at `chunk_cells` indices for large evaluations.
    """
    rng = np.random.default_rng(seed)
    step = max(1, chunk_cells // max(n_items, 1))  # resamples per chunk
    for start in range(0, n_resamples, step):
        yield rng.integers(0, n_items, size=(min(step, n_resamples - start), n_items))


def bootstrap_rates(
    errors: np.ndarray, n_ref: np.ndarray, n_resamples: int, seed: int, chunk_cells: int = 4_000_000
) -> np.ndarray:
    """Corpus error rate of `n_resamples` resamples of the items. errors, n_ref: [items] ints;
    returns [n_resamples] floats (NaN for a resample whose references are all empty)."""
    out = []
    for idx in _resample_chunks(len(errors), n_resamples, seed, chunk_cells):  # [rows, items]
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(errors[idx].sum(axis=1) / n_ref[idx].sum(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def paired_bootstrap_diffs(
    errors_a: np.ndarray, errors_b: np.ndarray, n_ref: np.ndarray, n_resamples: int, seed: int,
    chunk_cells: int = 4_000_000,
) -> np.ndarray:
    """WER(A) - WER(B) on the same resampled items (paired), [n_resamples]; inputs [items]."""
    out = []
    for idx in _resample_chunks(len(n_ref), n_resamples, seed, chunk_cells):  # [rows, items]
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append((errors_a[idx].sum(axis=1) - errors_b[idx].sum(axis=1)) / n_ref[idx].sum(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap samples (NaN-free samples assumed)."""
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def duration_bucket(duration: float | None, edges: Sequence[float] = DEFAULT_DURATION_EDGES) -> str:
    """'<2 s', '2-5 s', ..., '>=60 s', or 'unknown'; labels sort in bucket order via `bucket_order`."""
    if duration is None or not math.isfinite(duration):
        return "unknown"
    if duration < edges[0]:
        return f"<{edges[0]:g} s"
    for lo, hi in zip(edges, edges[1:]):
        if duration < hi:
            return f"{lo:g}-{hi:g} s"
    return f">={edges[-1]:g} s"


def bucket_order(edges: Sequence[float] = DEFAULT_DURATION_EDGES) -> list[str]:
    labels = [f"<{edges[0]:g} s"] + [f"{lo:g}-{hi:g} s" for lo, hi in zip(edges, edges[1:])]
    return labels + [f">={edges[-1]:g} s", "unknown"]


def sort_keys(keys: Iterable[str], key: Callable[[str], object] | None = None) -> list[str]:
    """Numeric-looking group values sort as numbers (speaker 19 before 103), others as text."""
    def natural(k: str) -> tuple[int, float, str]:
        try:
            return (0, float(k), k)
        except ValueError:
            return (1, 0.0, k)
    return sorted(keys, key=key or natural)
