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


def _has_flashinfer() -> bool:
    from batchscribe.model.flashinfer_backend import flashinfer_available

    return flashinfer_available()


def _has_triton() -> bool:
    from batchscribe.model.triton_cross import triton_available

    return triton_available()


needs_flashinfer = pytest.mark.skipif(not _has_flashinfer(), reason="needs flashinfer-python (the gpu extra)")

ATTENTION = [
    ("float16", "sdpa", "auto"),
    ("float32", "sdpa", "auto"),
    pytest.param("float16", "flashinfer", "auto", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/sdpa", "auto", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer", "fp8", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/flashinfer_hnd", "fp8", marks=needs_flashinfer),
    pytest.param("float16", "flashinfer/triton_hnd", "fp8", marks=needs_flashinfer),
    pytest.param("bfloat16", "flashinfer/triton_hnd", "auto", marks=needs_flashinfer),
    pytest.param("float16", "triton/triton_hnd", "fp8", marks=needs_flashinfer),
    pytest.param("bfloat16", "triton/flashinfer_hnd", "auto", marks=needs_flashinfer),
    pytest.param("float16", "auto", "auto", marks=needs_flashinfer),  # the default: whatever auto picks
]


@pytest.mark.parametrize("dtype,attention,cross_kv", ATTENTION)
def test_graph_replay_equals_eager_per_bucket(tiny_en_dir, utterances, dtype, attention, cross_kv) -> None:
    from batchscribe.api import Transcriber

    kw = dict(device="cuda", dtype=dtype, temperatures=(0.0,), attention=attention, cross_kv=cross_kv)
    for slots in (1, 3, 8, 32):
        eager = Transcriber(str(tiny_en_dir), batch_size=slots, cuda_graphs=False, **kw)
        graphed = Transcriber(str(tiny_en_dir), batch_size=slots, cuda_graphs=True, **kw)
        items = utterances[: max(4, 2 * slots)]
        a, b = _tokens(eager.transcribe(items)), _tokens(graphed.transcribe(items))
        assert a == b, f"slots={slots}"
        engine = next(iter(graphed._engines.values()))
        assert engine.graphs is not None and engine.graphs.buckets[-1] == slots
        assert engine.encoder_graphs is not None and max(engine.encoder_graphs.sizes) == {1: 1, 3: 2, 8: 8, 32: 32}[slots]
        assert next(iter(eager._engines.values())).encoder_graphs is None


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


def test_fused_greedy_step_transcribes_like_the_tensor_rules(tiny_en_dir, utterances, monkeypatch) -> None:
    """Greedy steps through triton_select's kernel (the CUDA default) and through the tensor rules
    (engine/logits, parity-tested against transformers): the same tokens, log-probabilities and
    no-speech probabilities on real speech, under CUDA graphs."""
    from batchscribe.api import Transcriber
    from batchscribe.engine import triton_select

    kw = dict(device="cuda", dtype="float16", batch_size=32, temperatures=(0.0,))
    fused_t = Transcriber(str(tiny_en_dir), **kw)
    fused = fused_t.transcribe(utterances)
    assert next(iter(fused_t._engines.values())).decoder.greedy is not None
    monkeypatch.setattr(triton_select, "triton_available", lambda: False)
    tensor_t = Transcriber(str(tiny_en_dir), **kw)
    tensor = tensor_t.transcribe(utterances)
    assert next(iter(tensor_t._engines.values())).decoder.greedy is None
    assert _tokens(fused) == _tokens(tensor)
    for a, b in zip(fused, tensor):
        for sa, sb in zip(a["segments"], b["segments"], strict=True):
            assert sa["avg_logprob"] == pytest.approx(sb["avg_logprob"], abs=1e-4)
            assert sa["no_speech_prob"] == pytest.approx(sb["no_speech_prob"], abs=1e-5)


@needs_flashinfer
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head,n_rows", [(6, 1), (6, 37), (20, 5), (20, 256)])
@pytest.mark.parametrize("cross_hnd", [False, True])
@pytest.mark.parametrize("self_kernel", ["flashinfer", "triton"])
def test_flashinfer_kernels_match_sdpa(dtype, n_head, n_rows, cross_hnd, self_kernel) -> None:
    """FlashInfer's (or the Triton kernel's) ragged self-attention and FlashInfer's paged
    cross-attention (model dtype and fp8) equal the SDPA reference over the same static caches,
    inside and outside a CUDA graph."""
    from batchscribe.model.attention import SdpaBackend
    from batchscribe.model.dims import ModelDims
    from batchscribe.model.flashinfer_backend import FlashInferBackend
    from batchscribe.model.whisper import DecoderCache

    dims = ModelDims.from_hf_config(dict(vocab_size=100, num_mel_bins=80, d_model=64 * n_head, encoder_layers=1,
                                         decoder_layers=1, encoder_attention_heads=n_head,
                                         decoder_attention_heads=n_head, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_source_positions=1500, max_target_positions=448))  # fmt: skip
    torch.manual_seed(n_rows)
    for cross_dtype in (None, torch.float8_e4m3fn):
        cache = DecoderCache.allocate(dims, n_rows, "cuda", dtype, cross_dtype, cross_hnd)
        for t in (cache.self_k[0], cache.self_v[0], cache.cross_k[0], cache.cross_v[0]):
            t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        q = torch.randn(n_rows, n_head, 64, device="cuda", dtype=dtype)
        positions = torch.randint(0, 448, (n_rows,), device="cuda")
        positions[0] = 0  # a row that sees only its own token
        fi, ref = FlashInferBackend(cache, dtype, self_kernel=self_kernel), SdpaBackend(cross_hnd=cross_hnd)
        fi.prepare(n_rows)
        out_self = torch.empty_like(q)
        out_cross = torch.empty_like(q)

        def step() -> None:
            fi.begin_step(positions, None)
            out_self.copy_(fi.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None))
            out_cross.copy_(fi.cross_attention(q, cache.cross_k[0], cache.cross_v[0], None))

        want_self = ref.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None).float()
        want_cross = ref.cross_attention(q, cache.cross_k[0], cache.cross_v[0], None).float()
        step()  # eager
        torch.testing.assert_close(out_self.float(), want_self, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out_cross.float(), want_cross, atol=2e-2, rtol=2e-2)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            step()
        positions.copy_(torch.randint(0, 448, (n_rows,), device="cuda"))  # new lengths, same graph
        graph.replay()
        want_self = ref.self_attention(q, cache.self_k[0], cache.self_v[0], None, positions, None).float()
        torch.testing.assert_close(out_self.float(), want_self, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out_cross.float(), want_cross, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not _has_triton(), reason="needs the triton package (it ships with CUDA torch on Linux)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("n_head,n_rows,min_programs", [(6, 1, 1024), (6, 37, 1), (20, 5, 1024), (20, 256, 1024), (20, 512, 1)])
def test_triton_cross_matches_sdpa(dtype, cache_dtype, n_head, n_rows, min_programs) -> None:
    """The compiled Triton cross kernel (split over frames or not) equals SDPA over the same HND
    cache rows, eagerly and replayed from a CUDA graph."""
    from batchscribe.model import triton_cross

    cfg = triton_cross.CrossConfig(min_programs=min_programs)
    torch.manual_seed(n_rows)
    shape = (n_rows + 3, n_head, 1500, 64)  # spare slots: row i reads slot i only
    k = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    v = torch.randn(shape, device="cuda").to(cache_dtype or dtype)
    q = torch.randn(n_rows, n_head, 64, device="cuda", dtype=dtype)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k[:n_rows].float(), v[:n_rows].float()
    ).squeeze(2)
    got = triton_cross.cross_attention(q, k, v, cfg)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(triton_cross.cross_attention(q, k, v, cfg))
    q.copy_(torch.randn_like(q))  # new queries, same graph
    graph.replay()
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k[:n_rows].float(), v[:n_rows].float()
    ).squeeze(2)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@needs_flashinfer
def test_flashinfer_engine_transcribes_like_sdpa(tiny_en_dir, utterances) -> None:
    """The whole engine on FlashInfer (graphs) against SDPA, fp16, real tiny.en: the same tokens on
    nearly every utterance (fp16 kernels sum in different orders, so rare near-ties may flip)."""
    from batchscribe.api import Transcriber

    kw = dict(device="cuda", dtype="float16", batch_size=16, temperatures=(0.0,))
    sdpa = _tokens(Transcriber(str(tiny_en_dir), attention="sdpa", **kw).transcribe(utterances))
    for attention in ("flashinfer", "flashinfer/sdpa", "flashinfer/flashinfer_hnd", "flashinfer/triton_hnd",
                      "triton/triton_hnd"):  # fmt: skip
        flash_t = Transcriber(str(tiny_en_dir), attention=attention, **kw)
        flash = _tokens(flash_t.transcribe(utterances))
        assert flash_t.model_info.attention == attention.split("/")[0] + "/" + attention.split("/")[-1] + "/float16"
        same = sum(sdpa[k] == flash[k] for k in sdpa)
        assert same >= len(utterances) - 2, (attention, same)


@needs_flashinfer
@pytest.mark.parametrize("attention", ["flashinfer/triton_hnd", "triton/triton_hnd"])
def test_triton_cross_skipping_inert_rows_changes_no_token(tiny_en_dir, utterances, attention) -> None:
    """The Triton kernels skip rows whose running flag is off (the default, under graphs); an
    eager engine with the skipping off computes every row: the same tokens."""
    from batchscribe.api import Transcriber

    kw = dict(device="cuda", dtype="float16", batch_size=16, temperatures=(0.0,), attention=attention)
    skipping_t = Transcriber(str(tiny_en_dir), **kw)
    skipping = _tokens(skipping_t.transcribe(utterances))
    assert next(iter(skipping_t._engines.values())).decoder.backend.live_rows is not None
    full_t = Transcriber(str(tiny_en_dir), cuda_graphs=False, **kw)
    full_t._engine(full_t.options).decoder.backend.live_rows = None
    assert _tokens(full_t.transcribe(utterances)) == skipping


@pytest.mark.parametrize("attention,cross_kv", [("sdpa", "auto"), pytest.param("auto", "auto", marks=needs_flashinfer),
                                                pytest.param("auto", "fp8", marks=needs_flashinfer)])  # fmt: skip
def test_compacting_the_tail_under_graphs_changes_no_token(tiny_en_dir, utterances, attention, cross_kv) -> None:
    """Under CUDA graphs, moving the tail's running windows into low rows (their state and K/V, fp8
    as bytes) and replaying smaller buckets gives the same tokens as stepping the full bucket."""
    from batchscribe.api import Transcriber

    got = {}
    for compact in (False, True):
        t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=16, temperatures=(0.0,),
                        attention=attention, cross_kv=cross_kv)  # fmt: skip
        t.transcribe(utterances[:1])
        engine = next(iter(t._engines.values()))
        assert engine.graphs is not None
        engine.compact_tail = compact
        engine.timings.clear()
        got[compact] = (_tokens(t.transcribe(utterances)), dict(engine.timings))
    (plain, plain_clock), (compacted, clock) = got[False], got[True]
    assert clock["compactions"] >= 1 and clock["row_steps"] < plain_clock["row_steps"]
    assert compacted == plain


@pytest.mark.parametrize("attention,cross_kv", [("sdpa", "auto"), pytest.param("auto", "fp8", marks=needs_flashinfer)])
def test_encoder_graphs_write_the_cross_cache_like_eager(tiny_en_dir, utterances, attention, cross_kv) -> None:
    """A captured admission chunk (features, encoder, cross K/V into the chunk's slots) writes the
    same cross cache as the same chunk run eagerly, for every chunk size, into any slots."""
    import numpy as np

    from batchscribe.api import Transcriber
    from batchscribe.audio.features import pad_or_trim
    from batchscribe.engine.decoding import ENCODER_CHUNKS

    n = 16
    t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=n, attention=attention,
                    cross_kv=cross_kv)  # fmt: skip
    t.transcribe(utterances[:2])
    engine = next(iter(t._engines.values()))
    dec, runner = engine.decoder, engine.encoder_graphs
    assert runner is not None and runner.sizes == [g for g in ENCODER_CHUNKS if g <= n]
    audio = torch.from_numpy(np.stack([pad_or_trim(a) for _, a in utterances[:n]])).cuda()  # [n, N_SAMPLES]
    caches = (*dec.cache.cross_k, *dec.cache.cross_v)

    def bits(slots: torch.Tensor) -> list[torch.Tensor]:
        return [c[slots].view(torch.uint8).clone() for c in caches]

    for size in runner.sizes:
        slots = torch.arange(n - size, n, device="cuda").flip(0)  # any slots, in any order
        runner.replay(audio[:size], slots)
        graphed = bits(slots)
        dec.encode_chunk(audio.flip(0)[:size], slots)  # other windows: the cache really changes
        assert any(not torch.equal(a, b) for a, b in zip(bits(slots), graphed)), size
        dec.encode_chunk(audio[:size], slots)
        assert all(torch.equal(a, b) for a, b in zip(bits(slots), graphed)), size



def test_decode_threads_fill_pinned_arena_and_records_are_unchanged(tiny_en_dir, shared_data, tmp_path) -> None:
    """On the GPU, `run` has decode threads decode into the engine's pinned arena by default and
    admission copies those samples as they are; the records equal runs whose audio was packed
    (threads with the arena off, and decode processes)."""
    import gc
    import json

    from batchscribe.api import Transcriber
    from batchscribe.config import DecodeOptions
    from batchscribe.run import RunOptions, run

    decode = DecodeOptions(temperatures=(0.0,))
    assert Transcriber(str(tiny_en_dir), device="cpu").host_allocator() is None
    parquet = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    texts = {}
    for threads, arena_on in ((True, None), (True, False), (False, None)):
        t = Transcriber(str(tiny_en_dir), device="cuda", dtype="float16", batch_size=16, decode=decode)
        out = tmp_path / f"threads-{threads}-{arena_on}"
        opts = RunOptions(model=str(tiny_en_dir), decode=decode, decode_threads=threads, workers=3, pinned_arena=arena_on)
        run([str(parquet)], out, opts, transcriber_factory=lambda _: t)
        records = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
        texts[threads, arena_on] = {r["id"]: (r["text"], [s["tokens"] for s in r["segments"]]) for r in records}
        arena = next(iter(t._engines.values())).decoder.arena
        if threads and arena_on is None:  # every utterance fit: all of them went through the arena
            assert arena is not None and arena.fallbacks == 0
            gc.collect()
            assert arena.in_use() == 0  # every range given back
        else:
            assert arena is None
    assert len(texts[True, None]) == 100
    assert texts[True, None] == texts[True, False] == texts[False, None]
