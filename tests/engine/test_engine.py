"""The engine (engine/engine.py) as an object: freed by reference counting alone, out of GPU
memory it halves its slots until they fit, and batch-invariant (on CUDA by default, on the CPU when
asked): a row's record does not depend on the rows decoded beside it."""

from __future__ import annotations

import gc
import random
import weakref
from collections import defaultdict

import numpy as np
import pytest
import torch

from batchscribe.api import Transcriber
from tests.engine.helpers import GREEDY, tokens
from tests.marks import needs_cuda


def _freed_without_the_collector(transcriber) -> bool:
    """Build an engine, drop it with the cycle collector off: is it gone?"""
    scheduler = transcriber.build_scheduler()
    list(scheduler.run([("warm", np.zeros(16000, np.float32))]))
    ref = weakref.ref(scheduler.engine)
    gc.collect()
    gc.disable()
    try:
        del scheduler
        return ref() is None
    finally:
        gc.enable()


def test_engine_holds_no_reference_cycle(tiny_en_dir) -> None:
    """Nothing the engine owns refers back to it (the step graphs capture the step's inputs, not
    the engine), so its caches go as soon as the last reference does."""
    from batchscribe.api import Transcriber

    assert _freed_without_the_collector(Transcriber(str(tiny_en_dir), device="cpu", batch_size=2))


@pytest.mark.gpu
@needs_cuda
def test_engine_with_graphs_holds_no_reference_cycle(tiny_en_dir) -> None:
    from batchscribe.api import Transcriber

    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=4)
    assert t.config.cuda_graphs and _freed_without_the_collector(t)


@pytest.mark.gpu
@needs_cuda
def test_real_out_of_memory_shrinks_slots(tiny_en_dir, utterances) -> None:
    """Fill the GPU so 256 slots of cache cannot fit: the engine halves its slots until they do,
    and still transcribes exactly what an unconstrained engine does."""
    from batchscribe.api import Transcriber
    from batchscribe.model.cache import DecoderCache

    items = utterances[:6]
    kw = dict(dtype="float16", temperatures=(0.0,))
    expected = tokens(Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, **kw).transcribe(items, sample_rate=16000))
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=256, **kw)  # model loaded first
    per_slot = DecoderCache.bytes_per_slot(t.model.dims, torch.float16)
    free, _ = torch.cuda.mem_get_info()
    # Leave room for ~40 slots of cache plus working memory, not for 256.
    ballast = torch.empty(int(free - 40 * per_slot - 2**30), dtype=torch.uint8, device="cuda")
    try:
        got = tokens(t.transcribe(items, sample_rate=16000))
        assert t.scheduler().engine.n_slots < 256
    finally:
        del ballast
        torch.cuda.empty_cache()
    assert got == expected


def _copies_differ(model_dir, utterances, device: str, rows: int, **options) -> list[str]:
    """Each of `rows` utterances transcribed three times in one run, its copies shuffled among the
    others (so each copy meets other admission groups, step widths and neighbours; one in three
    with an initial prompt, so prompt prefills mix too): the rows whose copies' records differ
    anywhere but in their ids."""
    work = [(f"{u}~{k}", audio, "Mister Quilter.") if i % 3 == 0 else (f"{u}~{k}", audio)
            for i, (u, audio) in enumerate(utterances[:rows]) for k in range(3)]  # fmt: skip
    random.Random(0).shuffle(work)
    t = Transcriber(str(model_dir), device=device, **GREEDY, **options)
    by_row: defaultdict[str, list[str]] = defaultdict(list)
    for record in t.transcribe_stream(work):
        row = record.pop("id").rsplit("~", 1)[0]
        by_row[row].append(repr(record))
    assert len(by_row) == rows and all(len(c) == 3 for c in by_row.values())
    return sorted(row for row, copies in by_row.items() if len(set(copies)) > 1)


@pytest.mark.parametrize("words", [False, True])
def test_batch_invariant_records_do_not_depend_on_the_batch(tiny_en_dir, utterances, words) -> None:
    """--batch-invariant on the CPU: every copy's record equal bit for bit (avg_logprob and
    no_speech_prob included; with word timestamps, every word's times and probability). Without it
    most rows' avg_logprob differ in the last digits (the GEMMs' kernels change with the step's
    row count and SDPA's sums with the attended length)."""
    assert _copies_differ(tiny_en_dir, utterances, "cpu", 6, batch_invariant=True, word_timestamps=words) == []


def test_the_default_engine_on_the_cpu_is_not_batch_invariant(tiny_en_dir, utterances) -> None:
    """What the option is for: the same harness finds rows whose copies differ without it (if this
    ever fails, the CPU's engine became batch-invariant by itself and the option's cost can go)."""
    assert _copies_differ(tiny_en_dir, utterances, "cpu", 6) != []


@pytest.mark.gpu
@needs_cuda
def test_records_on_cuda_do_not_depend_on_the_batch_by_default(tiny_en_dir, utterances) -> None:
    """The same on the GPU with its captured graphs, where it is the default: windows encoded in
    chunks of one size, every step at all the slots. Turned off, the harness finds rows that differ."""
    assert _copies_differ(tiny_en_dir, utterances, "cuda", 24) == []
    assert _copies_differ(tiny_en_dir, utterances, "cuda", 24, word_timestamps=True) == []
    assert _copies_differ(tiny_en_dir, utterances, "cuda", 24, batch_invariant=False) != []


def test_a_cpu_step_computes_its_rows_unless_batch_invariant(tiny_en_dir) -> None:
    """On the CPU a step's cost follows its rows: it computes the rows in use, or every slot when
    batch-invariant (one shape for every call). On CUDA: the graphs' buckets (tests/engine/test_graphs.py)."""
    for invariant in (False, True):
        engine = Transcriber(str(tiny_en_dir), device="cpu", batch_size=6, batch_invariant=invariant).scheduler().engine
        assert [engine.step_width(n) for n in range(1, 7)] == ([6] * 6 if invariant else [1, 2, 3, 4, 5, 6])


def test_an_engine_steps_the_prepared_model_whoever_built_it(base_dir) -> None:
    """The engine, not the Transcriber, puts the model in the step's fused forms (fused q/k/v, the
    logits over a vocabulary padded to 8): the benchmarks build engines from bare models, and the
    step they measure must be the one users run. base's 51,865 tokens get padded; its state dict
    stays the checkpoint's."""
    transcriber = Transcriber(str(base_dir), device="cpu", batch_size=2, **GREEDY)
    model = transcriber.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.decoder.logits_weight is None and model.decoder.layers[0].self_attn.qkv_weight is None
    transcriber.build_scheduler()
    assert all(layer.self_attn.qkv_weight is not None for layer in model.decoder.layers)
    assert model.decoder.logits_weight.shape[0] == 51872
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
