"""GPU engine: graph replay equals eager execution, per bucket, on real tiny.en. Needs CUDA."""

from __future__ import annotations

import io

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def utterances(shared_data):
    import pyarrow.parquet as pq
    import soundfile as sf

    rows = pq.read_table(shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet").to_pylist()[:40]
    return [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]


def _tokens(records: list[dict]) -> dict[str, list[int]]:
    return {r["id"]: [t for s in r["segments"] for t in s["tokens"]] for r in records}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_graph_replay_equals_eager_per_bucket(tiny_en_dir, utterances, dtype) -> None:
    from batchscribe.api import Transcriber

    # Greedy only: sampled fallback windows draw from the RNG a different number of times.
    for slots in (1, 3, 8, 32):
        eager = Transcriber(str(tiny_en_dir), device="cuda", dtype=dtype, batch_size=slots, cuda_graphs=False, temperatures=(0.0,))
        graphed = Transcriber(str(tiny_en_dir), device="cuda", dtype=dtype, batch_size=slots, cuda_graphs=True, temperatures=(0.0,))
        items = utterances[: max(4, 2 * slots)]
        a, b = _tokens(eager.transcribe(items)), _tokens(graphed.transcribe(items))
        assert a == b, f"slots={slots}"
        engine = next(iter(graphed._engines.values()))
        assert engine.graphs is not None and engine.graphs.buckets[-1] == slots


def test_gpu_fp32_equals_cpu(tiny_en_dir, utterances) -> None:
    """The same engine on CPU and GPU in fp32 gives the same transcripts (allowing rare near-ties)."""
    from batchscribe.api import Transcriber

    items = utterances[:16]
    kw = dict(dtype="float32", batch_size=8, temperatures=(0.0,))
    cpu = _tokens(Transcriber(str(tiny_en_dir), device="cpu", **kw).transcribe(items))
    gpu = _tokens(Transcriber(str(tiny_en_dir), device="cuda", **kw).transcribe(items))
    same = sum(cpu[k] == gpu[k] for k in cpu)
    assert same >= len(items) - 1


def test_features_on_gpu_equal_cpu(utterances) -> None:
    from batchscribe.audio.features import LogMel, pad_batch

    batch = pad_batch([a for _, a in utterances[:8]])
    cpu = LogMel(80, "cpu")(batch)
    gpu = LogMel(80, "cuda")(batch.cuda()).cpu()
    assert (cpu - gpu).abs().max() < 1e-4


def test_real_out_of_memory_shrinks_slots(tiny_en_dir, utterances) -> None:
    """Fill the GPU so 256 slots of cache cannot fit: the engine halves its slots until they do,
    and still transcribes exactly what an unconstrained engine does."""
    from batchscribe.api import Transcriber
    from batchscribe.model.whisper import DecoderCache

    items = utterances[:6]
    kw = dict(dtype="float16", temperatures=(0.0,))
    expected = _tokens(Transcriber(str(tiny_en_dir), device="cuda", batch_size=8, **kw).transcribe(items))
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    t = Transcriber(str(tiny_en_dir), device="cuda", batch_size=256, **kw)  # model loaded first
    per_slot = DecoderCache.bytes_per_slot(t.model.dims, torch.float16)
    free, _ = torch.cuda.mem_get_info()
    # Leave room for ~40 slots of cache plus working memory, not for 256.
    ballast = torch.empty(int(free - 40 * per_slot - 2**30), dtype=torch.uint8, device="cuda")
    try:
        got = _tokens(t.transcribe(items))
        engine = next(iter(t._engines.values()))
        assert engine.decoder.n_slots < 256
    finally:
        del ballast
        torch.cuda.empty_cache()
    assert got == expected


def test_sampled_fallback_graphs_equal_eager(tiny_en_dir, utterances) -> None:
    """Forced fallback to T=1.0: the lazily captured sampling graphs draw exactly what eager does."""
    from batchscribe.api import Transcriber

    kw = dict(device="cuda", dtype="float32", batch_size=8, temperatures=(0.0, 1.0), compression_ratio_threshold=0.0)
    items = utterances[:8]
    eager = _tokens(Transcriber(str(tiny_en_dir), cuda_graphs=False, **kw).transcribe(items))
    graphed_t = Transcriber(str(tiny_en_dir), cuda_graphs=True, **kw)
    graphed = _tokens(graphed_t.transcribe(items))
    assert eager == graphed
    runner = next(iter(graphed_t._engines.values())).graphs
    assert any(sample for (_, _, sample) in runner.graphs)
