"""The decoder cache (model/cache): the fp8 cast, an fp8 cross cache, and the heads-first cross layout,
on the CPU."""

from __future__ import annotations

import io

import pytest
import torch

from batchscribe.attention.registry import AttentionPlan, build_backend
from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.model.cache import DecoderCache, to_cache_dtype
from batchscribe.model.dims import ModelDims
from batchscribe.model.whisper import Whisper

FP8 = torch.float8_e4m3fn


def test_fp8_cast_saturates_instead_of_nan() -> None:
    x = torch.tensor([1000.0, -1000.0, 3.0, 0.0, 1e-9])
    y = to_cache_dtype(x, FP8).float()
    assert torch.isfinite(y).all()
    assert y[0] == 448 and y[1] == -448 and y[2] == 3.0 and y[3] == 0.0
    assert torch.equal(to_cache_dtype(x, torch.float16), x.half())  # other dtypes: a plain cast


def test_fp8_cross_cache_equals_sdpa_over_the_rounded_values() -> None:
    """With an fp8 cross cache the decoder attends over exactly the fp8-rounded K/V (SDPA upcasts)."""
    dims, model = _small_model(seed=0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # large values, so some K/V saturate or lose precision
    enc = torch.randn(3, 1500, 64)
    slots = torch.arange(3)
    fp8 = DecoderCache.allocate(dims, 3, "cpu", torch.float32, cross_dtype=FP8)
    ref = DecoderCache.allocate(dims, 3, "cpu", torch.float32)
    model.write_cross_kv(fp8, enc, slots)
    model.write_cross_kv(ref, enc, slots)
    assert fp8.cross_k[0].dtype == FP8 and fp8.self_k[0].dtype == torch.float32
    for i in range(dims.n_text_layer):  # the reference holds the same rounded values, in fp32
        ref.cross_k[i].copy_(fp8.cross_k[i].float())
        ref.cross_v[i].copy_(fp8.cross_v[i].float())
    tokens, positions = torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0])
    got = model.decode_step(fp8, tokens, positions)
    want = model.decode_step(ref, tokens, positions)
    torch.testing.assert_close(got, want)
    assert DecoderCache.bytes_per_slot(dims, torch.float32, FP8) < DecoderCache.bytes_per_slot(dims, torch.float32)


def test_heads_first_cross_cache_gives_the_same_logits() -> None:
    """The HND cross layout (heads first) is only a layout: the decoder's logits are equal."""
    dims, model = _small_model(seed=1)
    enc = torch.randn(4, 1500, 64)
    nhd = DecoderCache.allocate(dims, 5, "cpu", torch.float32)
    hnd = DecoderCache.allocate(dims, 5, "cpu", torch.float32, cross_hnd=True)
    assert hnd.cross_k[0].shape == (5, 4, 1500, 16) and hnd.cross_hnd and not nhd.cross_hnd
    slots = torch.tensor([3, 0, 4, 1])
    model.write_cross_kv(nhd, enc, slots)
    model.write_cross_kv(hnd, enc, slots)
    torch.testing.assert_close(hnd.cross_k[1].transpose(1, 2), nhd.cross_k[1])
    for step, positions in enumerate((torch.tensor([0, 0, 0, 0, 0]), torch.tensor([1, 1, 1, 1, 1]))):
        tokens = torch.tensor([5, 6, 7, 8, 9]) + step
        a = model.decode_step(nhd, tokens, positions)
        b = model.decode_step(hnd, tokens, positions, backend=SdpaBackend(cross_hnd=True))
        torch.testing.assert_close(a, b)
    rows = torch.tensor([1, 3])  # gathered rows (slots given) read the same
    torch.testing.assert_close(
        model.decode_step(nhd, torch.tensor([5, 6]), torch.tensor([2, 2]), rows),
        model.decode_step(hnd, torch.tensor([5, 6]), torch.tensor([2, 2]), rows),
    )
    with pytest.raises(ValueError, match="layout"):
        build_backend(AttentionPlan("sdpa", "flashinfer_hnd"), nhd, torch.float32)


def test_fp8_cross_kv_keeps_real_transcripts(tiny_en_dir, shared_data) -> None:
    """tiny.en with its cross K/V stored in fp8 transcribes real speech like the full-precision
    cache (greedy, fp32 elsewhere): the same words on nearly every utterance, WER within 1 point."""
    import jiwer
    import pyarrow.parquet as pq
    import soundfile as sf

    from batchscribe.api import Transcriber
    from batchscribe.eval.normalize import get_normalizer

    rows = pq.read_table(shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet").to_pylist()[:12]
    items = [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in rows]
    refs = [r["text"] for r in rows]
    texts = {}
    for cross_kv in ("auto", "fp8"):
        t = Transcriber(str(tiny_en_dir), device="cpu", batch_size=12, temperatures=(0.0,), cross_kv=cross_kv)
        texts[cross_kv] = [r["text"] for r in t.transcribe(items, sample_rate=16000)]
    norm = get_normalizer("english")
    same = sum(norm(a) == norm(b) for a, b in zip(texts["auto"], texts["fp8"]))
    assert same >= len(items) - 2, (texts["auto"], texts["fp8"])
    wer = {k: jiwer.wer([norm(r) for r in refs], [norm(h) for h in v]) for k, v in texts.items()}
    assert abs(wer["fp8"] - wer["auto"]) <= 0.01, wer


def _small_model(seed: int) -> tuple[ModelDims, Whisper]:
    """A randomly initialised 2-layer decoder (d_model 64, 4 heads) over 1500 encoder frames."""
    cfg = dict(vocab_size=300, num_mel_bins=80, d_model=64, encoder_layers=1, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
               max_source_positions=1500, max_target_positions=32)  # fmt: skip
    dims = ModelDims.from_hf_config(cfg)
    torch.manual_seed(seed)
    return dims, Whisper(dims).eval()



@pytest.mark.parametrize("cross_dtype", [None, FP8])
@pytest.mark.parametrize("hnd", [False, True])
def test_cross_rows_are_the_slots_kv_heads_first(cross_dtype, hnd: bool) -> None:
    """cross_rows reads any layout and dtype back as [G, H, n_audio_ctx, D] of the slots asked for,
    the values plain indexing gives (fp8 upcast exactly)."""
    dims = ModelDims(n_mels=80, n_audio_ctx=10, n_audio_state=16, n_audio_head=2, n_audio_layer=1, n_vocab=100,
                     n_text_ctx=8, n_text_state=16, n_text_head=2, n_text_layer=2)  # fmt: skip
    cache = DecoderCache.allocate(dims, 5, "cpu", torch.float32, cross_dtype, hnd)
    for t in (*cache.cross_k, *cache.cross_v):
        t.copy_(to_cache_dtype(torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel())), t.dtype))
    slots = torch.tensor([3, 0, 3])
    k, v = cache.cross_rows(1, slots, torch.float32)
    for got, stored in ((k, cache.cross_k[1]), (v, cache.cross_v[1])):
        want = torch.stack([stored[s].float() for s in slots.tolist()])
        assert got.shape == (3, 2, 10, 8) and got.dtype == torch.float32
        assert torch.equal(got, want if hnd else want.transpose(1, 2))


@pytest.mark.parametrize("hnd", [False, True])
def test_the_int4_cross_cache_holds_each_windows_quantised_kv(hnd: bool) -> None:
    """An int4 cache (cross_dtype uint8) holds what int4_cross.quantize makes of each window's K/V
    at its slot, whatever the layout flag; cross_rows gives it back dequantised, heads first; its
    size is what bytes_per_slot says; moving a slot's tensors (compaction) moves its scales too."""
    from batchscribe.attention import int4_cross

    dims, model = _small_model(seed=1)
    cache = DecoderCache.allocate(dims, 4, "cpu", torch.float32, torch.uint8, hnd)
    assert cache.cross_int4 and cache.cross_k[0].dtype == torch.uint8
    total = sum(t.numel() * t.element_size() for t in cache.tensors())
    assert total == 4 * DecoderCache.bytes_per_slot(dims, torch.float32, torch.uint8)
    assert DecoderCache.bytes_per_slot(dims, torch.float32, torch.uint8) < DecoderCache.bytes_per_slot(dims, torch.float32, FP8)
    enc, slots = torch.randn(2, 1500, 64), torch.tensor([3, 1])
    model.write_cross_kv(cache, enc, slots)
    attn = model.decoder.layers[1].encoder_attn
    for got, proj in zip(cache.cross_rows(1, slots, torch.float32), (attn.k_proj, attn.v_proj)):
        kv = attn.heads(proj(enc)).transpose(1, 2)  # [2, H, 1500, D]
        assert torch.equal(got, int4_cross.dequantize(*int4_cross.quantize(kv)))
    before = cache.cross_rows(0, torch.tensor([3]), torch.float32)[0]
    for t in cache.tensors():
        t[0] = t[3]  # what Slots.compact does with a running row
    assert torch.equal(cache.cross_rows(0, torch.tensor([0]), torch.float32)[0], before)
