"""CUDA graph replay equals eager with the options that add work around the captured steps: word
timestamps (the alignment pass between looks) and an initial prompt (the prefill at admission).
Kept apart from the openai-whisper comparisons so that a GPU image without openai-whisper or the
openai SDK runs them."""

from __future__ import annotations

import dataclasses

from tests.engine.helpers import GREEDY, records
from tests.marks import gpu

pytestmark = gpu
PROMPT = "Mutton, turnips and carrots. Stew! Mr. Bennet's girls."


def _replay_and_eager(tiny_en_dir, utterances, **options):
    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, **options, **GREEDY)
    eager = t.build_scheduler(config=dataclasses.replace(t.config, cuda_graphs=False))
    assert t.scheduler().engine.graphs is not None and eager.engine.graphs is None
    return records(t.scheduler(), utterances[:12]), records(eager, utterances[:12]), t.scheduler().engine


def test_graph_replay_equals_eager_with_words(tiny_en_dir, utterances) -> None:
    graphed, plain, engine = _replay_and_eager(tiny_en_dir, utterances, word_timestamps=True)
    assert engine.aligner.graphs is not None and engine.aligner.graphs.captured  # the pass was replayed
    assert graphed == plain
    assert all(r["words"] and all(s["words"] for s in r["segments"]) for r in graphed if r["text"].strip())


def test_the_pass_on_its_own_stream_gives_the_same_records(tiny_en_dir, utterances, monkeypatch) -> None:
    """The alignment pass on a side stream (alignment.SIDE_STREAM) beside the decode steps: the
    same records as on the steps' stream, with admissions refilling the slots it reads (8 slots,
    12 items), which wait for it (`fence`)."""
    from batchscribe.api import Transcriber
    from batchscribe.engine import alignment

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, word_timestamps=True, **GREEDY)
    same = records(t.scheduler(), utterances[:12])
    monkeypatch.setattr(alignment, "SIDE_STREAM", True)
    beside = t.build_scheduler()
    assert beside.engine.aligner.stream is not None and t.scheduler().engine.aligner.stream is None
    assert records(beside, utterances[:12]) == same
    assert any(r["words"] for r in same)


def test_graph_replay_equals_eager_with_a_prompt(tiny_en_dir, utterances) -> None:
    graphed, plain, engine = _replay_and_eager(tiny_en_dir, utterances, initial_prompt=PROMPT, batch_invariant=False)
    assert graphed == plain
    assert engine.prefill_graphs is None  # without batch invariance the prefill's shape changes with each admission


def test_graph_replay_equals_eager_with_a_prompt_batch_invariant(tiny_en_dir, utterances) -> None:
    """Batch-invariant prefills have one shape, captured on first use and replayed after: the same
    records as the eager prefill, bit for bit (the same kernels at the same shape)."""
    graphed, plain, engine = _replay_and_eager(tiny_en_dir, utterances, initial_prompt=PROMPT, batch_invariant=True)
    assert list(engine.prefill_graphs.captured) == [1 + engine.n_ctx // 2]  # slot + the whole prompt budget
    assert graphed == plain
    assert all(r["text"].strip() for r in graphed)


def test_a_prompted_admission_never_waits_for_the_gpu(tiny_en_dir, utterances) -> None:
    """The prefill's row index reaches the device without a stream sync: one would drain the looks
    queued ahead at every admission (a 100-token prompt cost W1 a third of its rate that way)."""
    import torch

    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, initial_prompt=PROMPT, **GREEDY)
    engine = t.scheduler().engine
    admit, prompted = engine.admit, []

    def strict(requests, slots):  # any synchronising call inside admit raises
        torch.cuda.set_sync_debug_mode("error")
        try:
            admit(requests, slots)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        prompted.append(sum(r.sot_index > 0 for r in requests))

    engine.admit = strict
    out = records(t.scheduler(), utterances[:12])
    assert sum(prompted) == 12 and len(out) == 12  # each item's first window was admitted with its prompt
