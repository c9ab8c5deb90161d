"""The alignment matrix of a batch of windows (engine/alignment.py `batch_matrix`) against
openai-whisper's find_alignment steps run on each window alone (softmax over its frames, standardised
over its tokens, timing.median_filter, mean over heads), and a window's values the same alone and
beside others (what makes a GPU run's words independent of which windows finish together)."""

from __future__ import annotations

import pytest
import torch

from batchscribe.engine.alignment import MEDIAN_WIDTH, batch_matrix

timing = pytest.importorskip("whisper.timing")
ROWS = [5, 3, 12, 30, 7, 4]  # a window has at least <|notimestamps|>, one token and <|endoftext|>
FRAMES = [40, 3, 200, 750, 1, 4]  # 3 and 1: too short to mirror; 750: every frame


def _openai(qk: torch.Tensor, rows: int, frames: int) -> torch.Tensor:
    weights = qk[:, :rows, :frames].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    return timing.median_filter((weights - mean) / std, MEDIAN_WIDTH).mean(dim=0)


def test_each_window_equals_openais_steps() -> None:
    qk = torch.randn(len(ROWS) + 2, 3, 32, 750, generator=torch.Generator().manual_seed(0))  # 2 padding windows
    got = batch_matrix(qk, ROWS, FRAMES)
    assert got.shape == (len(ROWS), max(ROWS), max(FRAMES))
    for b, (rows, frames) in enumerate(zip(ROWS, FRAMES)):
        torch.testing.assert_close(got[b, :rows, :frames], _openai(qk[b], rows, frames), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)  # one frame: openai's std is 0 too


def test_a_window_is_the_same_alone_and_in_a_batch() -> None:
    qk = torch.randn(len(ROWS), 3, 32, 750, generator=torch.Generator().manual_seed(1))
    together = batch_matrix(qk, ROWS, FRAMES, budget=1 << 20)  # the median in several parts
    for b, (rows, frames) in enumerate(zip(ROWS, FRAMES)):
        alone = batch_matrix(qk[b : b + 1], [rows], [frames])
        torch.testing.assert_close(alone[0, :rows, :frames], together[b, :rows, :frames], rtol=0, atol=0,
                                   equal_nan=True)  # fmt: skip


def test_out_of_memory_halves_the_batch_and_loses_no_window(tiny_en_dir, utterances, monkeypatch, caplog) -> None:
    """A batch that runs out of memory is retried in halves; every window is timed once, in order,
    as the unhindered pass times it (real tiny.en; the failure is injected once)."""
    from batchscribe.audio.features import LogMel
    from batchscribe.constants import HOP_LENGTH, N_SAMPLES
    from batchscribe.engine.alignment import Aligner, AlignWindow
    from batchscribe.model.alignment_heads import resolve_alignment_heads
    from tests.engine.helpers import greedy_transcriber

    tiny = greedy_transcriber(tiny_en_dir)
    items = [(i, a) for i, a in utterances[:6] if len(a) <= N_SAMPLES]
    records = tiny.transcribe(items, sample_rate=16000)
    tok = tiny.tokenizer
    heads = resolve_alignment_heads({}, tiny.model.dims, ("tiny.en",), "tiny.en")
    windows = [AlignWindow(a, (tok.sot,), tuple(t for s in r["segments"] for t in s["tokens"] if t < tok.eot),
                           len(a) // HOP_LENGTH) for (_, a), r in zip(items, records)]  # fmt: skip

    def aligner() -> Aligner:
        return Aligner(tiny.model, LogMel(tiny.model.dims.n_mels), tiny.model.encoder, heads, tok.eot,
                       tok.no_timestamps, max_batch=4)  # fmt: skip

    expected = aligner()(windows)
    failing, real, calls = aligner(), Aligner._batch, []

    def batch(self, part):
        calls.append(len(part))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, part)

    monkeypatch.setattr(Aligner, "_batch", batch)
    got = failing(windows)
    assert calls[:2] == [4, 2] and failing.max_batch == 2 and "aligning at most 2 windows" in caplog.text
    assert len(got) == len(windows)
    for ours, theirs in zip(got, expected):
        assert ours.token_probs == pytest.approx(theirs.token_probs, abs=1e-6)
        assert [list(p) for p in ours.path] == [list(p) for p in theirs.path]
