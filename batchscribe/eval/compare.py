"""Two reports over the same references: per-item wins/losses and WER(A) - WER(B) with a paired
bootstrap 95% interval (the same resampled items for both systems, so item difficulty cancels)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchscribe.eval.report import Item, Report
from batchscribe.eval.wer import interval, paired_bootstrap_diffs


@dataclass(frozen=True)
class ItemChange:
    id: str
    errors_a: int
    errors_b: int
    n_ref: int


@dataclass(frozen=True)
class Comparison:
    name_a: str
    name_b: str
    n_items: int  # items scored in both reports (the pairs every figure below is over)
    wer_a: float
    wer_b: float
    diff: float  # wer_a - wer_b: negative means A makes fewer errors
    ci: tuple[float, float] | None  # paired bootstrap 95% interval of diff
    wins_a: tuple[ItemChange, ...]  # A has fewer errors than B on these items
    wins_b: tuple[ItemChange, ...]
    ties: int
    only_in_a: tuple[str, ...]
    only_in_b: tuple[str, ...]
    bootstrap: int
    seed: int


def compare(report_a: Report, report_b: Report, *, name_a: str = "A", name_b: str = "B",
            bootstrap: int | None = None, seed: int | None = None) -> Comparison:
    """Pair items by id. Both reports must have scored the same normalised reference for an id."""
    b_items = {i.id: i for i in report_b.items}
    pairs: list[tuple[Item, Item]] = []
    for a in report_a.items:
        b = b_items.get(a.id)
        if b is None:
            continue
        if a.ref_norm != b.ref_norm:
            raise ValueError(f"item {a.id!r} has different references in the two reports ({a.ref_norm!r} vs "
                             f"{b.ref_norm!r}); evaluate both against the same --references and --normalizer")
        pairs.append((a, b))
    a_ids = {i.id for i in report_a.items}
    n_boot = report_a.settings.bootstrap if bootstrap is None else bootstrap
    seed = report_a.settings.seed if seed is None else seed

    err_a = np.array([a.words.errors for a, _ in pairs], dtype=np.int64)  # [pairs]
    err_b = np.array([b.words.errors for _, b in pairs], dtype=np.int64)  # [pairs]
    n_ref = np.array([a.words.n_ref for a, _ in pairs], dtype=np.int64)  # [pairs]
    total = int(n_ref.sum())
    wer_a = err_a.sum() / total if total else float("nan")
    wer_b = err_b.sum() / total if total else float("nan")
    ci = None
    if n_boot > 0 and total:
        diffs = paired_bootstrap_diffs(err_a, err_b, n_ref, n_boot, seed)
        finite = diffs[np.isfinite(diffs)]
        ci = interval(finite) if finite.size else None
    changes = [ItemChange(a.id, a.words.errors, b.words.errors, a.words.n_ref) for a, b in pairs]
    # biggest differences first: what a reader wants to look at
    wins_a = sorted((c for c in changes if c.errors_a < c.errors_b), key=lambda c: (c.errors_a - c.errors_b, c.id))
    wins_b = sorted((c for c in changes if c.errors_b < c.errors_a), key=lambda c: (c.errors_b - c.errors_a, c.id))
    return Comparison(
        name_a, name_b, len(pairs), float(wer_a), float(wer_b), float(wer_a - wer_b), ci,
        tuple(wins_a), tuple(wins_b), sum(c.errors_a == c.errors_b for c in changes),
        tuple(i.id for i in report_a.items if i.id not in b_items),
        tuple(i.id for i in report_b.items if i.id not in a_ids), n_boot, seed,
    )
