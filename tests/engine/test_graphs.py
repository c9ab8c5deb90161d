"""CUDA graphs (engine/graphs.py): graph replay equals eager execution, per bucket, on real tiny.en."""

from __future__ import annotations

import pytest

from tests.engine.helpers import records, token_differences, tokens
from tests.marks import gpu, needs_flashinfer

pytestmark = gpu


ATTENTION = [
    ("float16", "sdpa", "auto"),
    ("float32", "sdpa", "auto"),
    pytest.param("float16", "flashinfer", "auto", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/sdpa", "auto", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer", "fp8", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/flashinfer_hnd", "fp8", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/triton_hnd", "fp8", marks=needs_flashinfer),
    pytest.param("bfloat16", "flashinfer/triton_hnd", "auto", marks=needs_flashinfer),
    ("float16", "triton/triton_hnd", "fp8"),  # Triton alone: no FlashInfer needed
    pytest.param("bfloat16", "triton/flashinfer_hnd", "auto", marks=needs_flashinfer),
    ("float16", "auto", "auto"),  # the default: whatever auto picks
    ("bfloat16", "auto", "int4"),  # the int4 cross cache: Triton's int4 kernel
]


@pytest.mark.parametrize("dtype,attention,cross_kv", ATTENTION)
def test_graph_replay_equals_eager_per_bucket(tiny_en_dir, utterances, dtype, attention, cross_kv) -> None:
    from batchscribe.api import Transcriber

    # Off: the per-bucket path (a batch-invariant engine, CUDA's default, has one bucket and one chunk size)
    kw = dict(device="cuda", dtype=dtype, temperatures=(0.0,), attention=attention, cross_kv=cross_kv,
              batch_invariant=False)  # fmt: skip
    for slots in (1, 3, 8, 32):
        eager = Transcriber(str(tiny_en_dir), batch_size=slots, cuda_graphs=False, **kw)
        graphed = Transcriber(str(tiny_en_dir), batch_size=slots, cuda_graphs=True, **kw)
        items = utterances[: max(4, 2 * slots)]
        a, b = tokens(eager.transcribe(items, sample_rate=16000)), tokens(graphed.transcribe(items, sample_rate=16000))
        assert a == b, f"slots={slots}: {token_differences(a, b)}"
        engine = graphed.scheduler().engine
        assert engine.graphs is not None and engine.graphs.buckets[-1] == slots
        assert engine.encoder_graphs is not None and max(engine.encoder_graphs.sizes) == {1: 1, 3: 2, 8: 8, 32: 32}[slots]
        assert eager.scheduler().engine.encoder_graphs is None
        # eager steps ran the rows the graphed engine's captures hold: the same shapes, whatever the
        # kernels' sums (the smallest captured bucket that holds n, worked out here, not by bucket_for)
        widths = [eager.scheduler().engine.step_width(n) for n in range(1, slots + 1)]
        assert widths == [min(b for b, _, _ in engine.graphs.graphs if b >= n) for n in range(1, slots + 1)]


def test_sampled_fallback_graphs_equal_eager(tiny_en_dir, utterances) -> None:
    """Forced fallback to T=1.0: the lazily captured sampling graphs draw exactly what eager does."""
    from batchscribe.api import Transcriber

    kw = dict(device="cuda", dtype="float32", batch_size=8, temperatures=(0.0, 1.0), compression_ratio_threshold=0.0)
    items = utterances[:8]
    eager = tokens(Transcriber(str(tiny_en_dir), cuda_graphs=False, **kw).transcribe(items, sample_rate=16000))
    graphed_t = Transcriber(str(tiny_en_dir), cuda_graphs=True, **kw)
    graphed = tokens(graphed_t.transcribe(items, sample_rate=16000))
    assert eager == graphed, token_differences(eager, graphed)
    runner = graphed_t.scheduler().engine.graphs
    assert any(sample for (_, _, sample) in runner.graphs)


@pytest.mark.parametrize("attention,cross_kv", [("sdpa", "auto"), ("auto", "auto"), ("auto", "fp8"), ("auto", "int4")])
def test_compacting_the_tail_under_graphs_changes_no_token(tiny_en_dir, utterances, attention, cross_kv) -> None:
    """Under CUDA graphs, moving the tail's running windows into low rows (their state and K/V, fp8
    as bytes) and replaying smaller buckets gives the same tokens as stepping the full bucket."""
    from batchscribe.api import Transcriber

    got = {}
    for compact in (False, True):
        t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=16, temperatures=(0.0,),
                        attention=attention, cross_kv=cross_kv, batch_invariant=False)  # smaller buckets: off
        sched = t.scheduler()
        assert sched.engine.graphs is not None
        got[compact] = (tokens(records(sched, utterances, compact_tail=compact)), dict(sched.timings))
    (plain, plain_clock), (compacted, clock) = got[False], got[True]
    assert clock["compactions"] >= 1 and clock["row_steps"] < plain_clock["row_steps"]
    assert compacted == plain, token_differences(plain, compacted)
