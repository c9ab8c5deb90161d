"""The 4-bit cross cache (attention/int4_cross, `--cross-kv int4`): its format against a direct
reading of the layout; its Triton kernel against SDPA over the dequantised cache, on the CPU
through Triton's interpreter and (on a GPU) compiled, eagerly and from a CUDA graph; and real
tiny.en transcripts on the CPU against the same model attending over quantised-then-dequantised
K/V held in an ordinary cache."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from batchscribe.attention import int4_cross
from tests.marks import needs_cuda


def test_values_pack_by_halves_with_one_scale_per_frame() -> None:
    torch.manual_seed(0)
    kv = torch.randn(2, 3, 5, 8)  # [slots, heads, frames, head_dim]
    kv[0, 0, 0] = 0  # a silent frame: scale floor, zeros back
    packed, scale = int4_cross.quantize(kv)
    assert packed.shape == (2, 3, 5, 4) and packed.dtype == torch.uint8
    assert scale.shape == (2, 3, 5) and scale.dtype == torch.float16
    # Read the layout by hand: byte j's low nibble is value j, its high nibble value j + 4.
    byte = packed.to(torch.int32)
    lo, hi = byte & 0xF, byte >> 4
    signed = torch.cat([lo, hi], dim=-1)
    signed = torch.where(signed > 7, signed - 16, signed)
    expect = (kv / scale.float()[..., None]).round().clamp(-7, 7)
    assert torch.equal(signed, expect.to(torch.int32))
    assert signed.abs().amax(-1).flatten()[1:].eq(7).all()  # each frame's largest value takes level 7
    back = int4_cross.dequantize(packed, scale)
    assert torch.equal(back, signed.float() * scale.float()[..., None])
    assert (back - kv).abs().le(scale.float()[..., None] / 2 + 1e-6).all()  # half a step at most
    assert back[0, 0, 0].eq(0).all()


def test_negative_values_and_extremes_survive_the_round_trip() -> None:
    kv = torch.tensor([[[7.0, -7.0, 3.0, -1.0, 0.0, 7.0, -3.0, 1.0]]])  # amax 7: scale 1, exact
    back = int4_cross.dequantize(*int4_cross.quantize(kv))
    assert torch.equal(back, kv)


def test_a_cache_holds_each_slots_frames_then_their_scales() -> None:
    torch.manual_seed(1)
    cache = int4_cross.allocate(4, 3, 10, 8, "cpu")  # 4 slots, 3 heads, 10 frames, head_dim 8
    assert cache.shape == (4, 3, 10 * (4 + 2))
    kv = torch.randn(2, 10, 3, 8)  # [windows, frames, heads, head_dim], as the projection gives them
    int4_cross.store(cache, kv, torch.tensor([2, 0]))
    packed, scale = int4_cross.quantize(kv.transpose(1, 2))
    # By hand: slot 2, head 1 holds window 0's 10 frames of 4 bytes, then their 10 fp16 scales.
    assert torch.equal(cache[2, 1, :40].view(10, 4), packed[0, 1])
    assert torch.equal(cache[2, 1, 40:].view(torch.float16), scale[0, 1])
    assert torch.equal(int4_cross.rows(cache, torch.tensor([0, 2]), 8, torch.float32),
                       int4_cross.dequantize(packed, scale).flip(0))  # fmt: skip
    assert cache[1].eq(0).all() and cache[3].eq(0).all()  # other slots untouched


# Run by the triton_interpreter fixture (conftest): a fresh process under TRITON_INTERPRET.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.attention import int4_cross as ic
    from batchscribe.attention.triton_common import split_for
    from batchscribe.attention.triton_cross import CrossConfig
    torch.manual_seed(0)
    cases = [  # rows, heads, frames, q dtype, config
        (3, 2, 1500, torch.float32, CrossConfig()),
        (2, 3, 1500, torch.float32, CrossConfig(min_programs=1)),
        (2, 2, 300, torch.float16, CrossConfig(block_n=64)),
    ]
    for rows, heads, n, qd, cfg in cases:
        q = torch.randn(rows, heads, 64).to(qd)
        k, v = ic.allocate(rows + 2, heads, n, 64, "cpu"), ic.allocate(rows + 2, heads, n, 64, "cpu")
        every = torch.arange(rows + 2)  # more slots than rows: rows [0, B) are read
        ic.store(k, torch.randn(rows + 2, n, heads, 64), every)
        ic.store(v, torch.randn(rows + 2, n, heads, 64), every)
        out = ic.cross_attention(q, k, v, cfg)
        kd, vd = ic.rows(k, every, 64, torch.float32)[:rows], ic.rows(v, every, 64, torch.float32)[:rows]
        ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), kd, vd).squeeze(2)
        assert out.dtype == q.dtype and out.shape == q.shape
        tol = 1e-5 if qd == torch.float32 else 2e-3
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
        live = torch.tensor([i % 2 == 0 for i in range(rows + 2)])
        skipped = ic.cross_attention(q, k, v, cfg, live=live)
        assert torch.isfinite(skipped.float()).all()
        torch.testing.assert_close(skipped[live[:rows]].float(), ref[live[:rows]], atol=tol, rtol=tol)
        assert not torch.allclose(skipped[1].float(), ref[1], atol=tol, rtol=tol)  # row 1 was skipped
        print(split_for(rows, heads, n, cfg), flush=True)
    """
)


def test_int4_cross_attention_matches_sdpa_in_the_interpreter(triton_interpreter) -> None:
    pytest.importorskip("triton")
    splits = [int(line) for line in triton_interpreter(CHECK)]
    assert splits[0] > 1 and splits[1] == 1  # the split-and-merge path and the direct one


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("in_graph", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head,n_rows", [(6, 1), (20, 37), (20, 256)])
def test_int4_cross_matches_sdpa_on_the_gpu(in_graph, dtype, n_head, n_rows) -> None:
    from tests.attention.helpers import capture

    torch.manual_seed(0)
    dev = torch.device("cuda")
    q = torch.randn(n_rows, n_head, 64, device=dev, dtype=dtype)
    every = torch.arange(n_rows + 3, device=dev)
    k, v = (int4_cross.allocate(n_rows + 3, n_head, 1500, 64, dev) for _ in range(2))
    for cache in (k, v):
        int4_cross.store(cache, torch.randn(n_rows + 3, 1500, n_head, 64, device=dev, dtype=dtype), every)
    ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), int4_cross.rows(k, every, 64, torch.float32)[:n_rows],
                                         int4_cross.rows(v, every, 64, torch.float32)[:n_rows]).squeeze(2)  # fmt: skip
    if in_graph:
        out = []
        graph = capture(lambda: out.append(int4_cross.cross_attention(q, k, v)))
        graph.replay()
        torch.cuda.synchronize()
        got = out[-1]
    else:
        got = int4_cross.cross_attention(q, k, v)
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)


def test_int4_transcripts_equal_attention_over_the_dequantised_kv(tiny_en_dir, utterances, monkeypatch) -> None:
    """`cross_kv="int4"` on the CPU (the int4 cache, SDPA dequantising it) gives the transcripts of
    the plain engine whose cross K/V are quantised and dequantised before an ordinary cache holds
    them: the cache stores exactly the format, and nothing else changes. The int4 run changes some
    transcripts against the default (docs/GPU_NOTES.md), so the equality is not the default's."""
    from batchscribe.api import Transcriber
    from batchscribe.model import cross_write

    items = utterances[:6]
    kw = dict(device="cpu", temperatures=(0.0,))
    int4 = Transcriber(str(tiny_en_dir), cross_kv="int4", **kw)
    assert int4.describe()["engine"]["attention"] == "sdpa/sdpa/int4"
    got = {r["id"]: r["text"] for r in int4.transcribe(items, sample_rate=16000)}
    assert int4.scheduler().engine.cache.cross_int4  # the engine's cache is the packed one
    int4.release()
    store = cross_write.store

    def through_int4(cache, kv, slots, hnd):  # the reference: the format's values, in the model's dtype
        store(cache, int4_cross.dequantize(*int4_cross.quantize(kv), dtype=kv.dtype), slots, hnd)

    monkeypatch.setattr(cross_write, "store", through_int4)
    want = {r["id"]: r["text"] for r in Transcriber(str(tiny_en_dir), **kw).transcribe(items, sample_rate=16000)}
    assert got == want
