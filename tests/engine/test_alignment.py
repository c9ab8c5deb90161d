"""The alignment pass (engine/alignment.py) on real tiny.en, reading each window's cross K/V from
its decoder slot: an out-of-memory batch retried in halves, and on CUDA a window's words independent
of its batch and of graph replay. Its agreement with openai's find_alignment is tests/test_words.py's."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import GREEDY
from tests.marks import needs_cuda


def _decoded(tiny_en_dir, utterances, n: int):
    """Real tiny.en on the CPU over the first n utterances (at most 30 s): the transcriber, the
    items' audio and one AlignWindow per item, window k's slot k (its tokens as decoded)."""
    from batchscribe.constants import HOP_LENGTH, N_SAMPLES
    from batchscribe.engine.alignment import AlignWindow
    from tests.engine.helpers import greedy_transcriber

    tiny = greedy_transcriber(tiny_en_dir)
    items = [(i, a) for i, a in utterances[:n] if len(a) <= N_SAMPLES]
    records = tiny.transcribe(items, sample_rate=16000)
    tok = tiny.tokenizer
    windows = [AlignWindow(k, (tok.sot,), tuple(t for s in r["segments"] for t in s["tokens"] if t < tok.eot),
                           len(a) // HOP_LENGTH) for k, ((_, a), r) in enumerate(zip(items, records))]  # fmt: skip
    return tiny, [a for _, a in items], windows


def test_out_of_memory_halves_the_batch_and_loses_no_window(tiny_en_dir, utterances, monkeypatch, caplog) -> None:
    """A batch that runs out of memory is retried in halves; every window is timed once, in order,
    as the unhindered pass times it (real tiny.en; the failure is injected once)."""
    from batchscribe.engine.alignment import Aligner
    from tests.engine.helpers import aligner_over

    tiny, audios, windows = _decoded(tiny_en_dir, utterances, 6)
    tok = tiny.tokenizer

    def aligner() -> Aligner:
        return aligner_over(tiny.model, audios, tok.eot, tok.no_timestamps, max_batch=4)

    expected = aligner()(windows)
    failing, real, calls = aligner(), Aligner._batch, []

    def batch(self, part, length):
        calls.append(len(part))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, part, length)

    monkeypatch.setattr(Aligner, "_batch", batch)
    got = failing(windows)
    assert calls[:2] == [4, 2] and failing.max_batch == 2 and "aligning at most 2 windows" in caplog.text
    assert len(got) == len(windows)
    for ours, theirs in zip(got, expected):
        # On the CPU a batch is padded to its longest window, so halving it changes the GEMMs'
        # shapes and with them float32 rounding (seen: 3.3e-6 on one probability); the paths must
        # not change.
        assert ours.token_probs == pytest.approx(theirs.token_probs, abs=2e-5)
        assert [list(p) for p in ours.path] == [list(p) for p in theirs.path]


def test_the_pass_counts_its_batches_and_times_its_host_parts(tiny_en_dir, utterances) -> None:
    """The engine's counters (benchmarks print them) get each batch, its windows, and the host's
    seconds by part: packing, the eager pass (the CPU has no graphs), the wait and the unpacking."""
    from tests.engine.helpers import aligner_over

    tiny, audios, windows = _decoded(tiny_en_dir, utterances, 5)
    aligner = aligner_over(tiny.model, audios, tiny.tokenizer.eot, tiny.tokenizer.no_timestamps, max_batch=2)
    aligner(windows)
    clock = aligner.timings
    assert (clock["align_batches"], clock["align_batch_windows"]) == ((len(windows) + 1) // 2, len(windows))
    assert min(clock[k] for k in ("align_pack_s", "align_eager_s", "align_copies_s", "align_unpack_s")) > 0
    assert clock["align_sync_s"] >= 0 and "align_replay_s" not in clock
    assert clock["align_eager_s"] > clock["align_pack_s"]  # the pass itself is the CPU's work


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_window_is_timed_alike_alone_beside_others_and_by_replay(tiny_en_dir, utterances) -> None:
    """The CUDA pass at its fixed shapes: a window's path and probabilities do not depend on the
    windows batched with it, graph replay equals the eager first run of a bucket, also with several
    passes queued before any is read (each batch's copies queued behind its own replay, before the
    next replay of its bucket rewrites the graph's outputs), and the paths equal the CPU pass's for
    nearly every window (the dtype differs: fp16 or bf16 there)."""
    from batchscribe.api import Transcriber
    from tests.engine.helpers import aligner_over

    cpu, audios, windows = _decoded(tiny_en_dir, utterances, 12)
    tok = cpu.tokenizer
    gpu = Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, **GREEDY).model
    eager = aligner_over(gpu, audios, tok.eot, tok.no_timestamps, max_batch=8)
    graphed = aligner_over(gpu, audios, tok.eot, tok.no_timestamps, max_batch=8, graphs=True)
    together = eager(windows)
    alone = [eager([w])[0] for w in windows]
    runs = [graphed(windows)]  # eager: the buckets' first use
    queued = [graphed.submit(windows) for _ in range(3)]  # capture + replay, then replays; none read yet
    runs += [pending.result() for pending in reversed(queued)]
    assert graphed.graphs is not None and graphed.graphs.captured
    # The host counters name each batch's launch: the first eager, then a capture, then replays.
    assert min(graphed.timings[k] for k in ("align_eager_s", "align_capture_s", "align_replay_s")) > 0
    reference = aligner_over(cpu.model, audios, tok.eot, tok.no_timestamps, max_batch=8)(windows)
    same_as_cpu = 0
    for k, w in enumerate(windows):
        for other in [alone[k], *(run[k] for run in runs)]:
            assert [list(p) for p in other.path] == [list(p) for p in together[k].path]
            assert other.token_probs == together[k].token_probs
        assert together[k].token_probs == pytest.approx(reference[k].token_probs, abs=0.05)
        same_as_cpu += [list(p) for p in together[k].path] == [list(p) for p in reference[k].path]
    assert same_as_cpu >= len(windows) - 2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("hnd", [True, False])
def test_on_cuda_the_in_place_kernel_times_words_as_the_gather_does(tiny_en_dir, utterances, hnd) -> None:
    """The pass's cross-attention read in place in the slots (attention/triton_window.py, the CUDA
    default in fp16/bf16) against the slots gathered and SDPA: the same DTW path for nearly every
    window and token probabilities within fp16 rounding, eagerly and by graph replay."""
    from batchscribe.api import Transcriber
    from tests.engine.helpers import aligner_over

    cpu, audios, windows = _decoded(tiny_en_dir, utterances, 12)
    tok = cpu.tokenizer
    gpu = Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, **GREEDY).model
    gather = aligner_over(gpu, audios, tok.eot, tok.no_timestamps, max_batch=8, in_place=False, hnd=hnd)
    in_place = aligner_over(gpu, audios, tok.eot, tok.no_timestamps, max_batch=8, graphs=True, hnd=hnd)
    assert in_place._head_index and not gather._head_index
    want = gather(windows)
    for run in (in_place(windows), in_place(windows), in_place(windows)):  # eager, capture, replay
        same = 0
        for ours, theirs in zip(run, want):
            assert ours.token_probs == pytest.approx(theirs.token_probs, abs=0.02)
            same += [list(p) for p in ours.path] == [list(p) for p in theirs.path]
        assert same >= len(windows) - 1
