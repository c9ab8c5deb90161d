"""The engine (engine/engine.py) as an object: freed by reference counting alone, and out of GPU
memory it halves its slots until they fit."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from tests.engine.helpers import tokens
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
