"""batchscribe's Triton kernels as attention kernels (attention/triton), on a GPU: a decode step's
self-attention that stores the step's K/V itself (TritonSelf.write_and_attend) against index_put
then SDPA (what every other kernel does), eagerly and replayed in a CUDA graph with new positions."""

from __future__ import annotations

import pytest
import torch

from batchscribe.attention.base import AttentionBackend
from batchscribe.attention.sdpa import SdpaBackend, SdpaCross
from batchscribe.attention.triton import TritonSelf
from tests.attention.helpers import capture
from tests.marks import gpu

pytestmark = gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_head,n_rows", [(6, 1), (6, 37), (20, 256)])
def test_write_and_attend_equals_index_put_then_sdpa_in_and_out_of_a_graph(dtype, n_head, n_rows) -> None:
    torch.manual_seed(n_rows)
    n_slots, n_ctx, device = n_rows + 3, 448, "cuda"
    cache = torch.randn(2, n_slots, n_ctx, n_head, 64, device=device).to(dtype)
    k_cache, v_cache = cache.clone().unbind(0)
    want_k, want_v = cache.clone().unbind(0)
    ours, ref = AttentionBackend(TritonSelf(k_cache, dtype), SdpaCross()), SdpaBackend()
    live = torch.rand(n_slots, device=device) < 0.8  # the decoder's running flags: some rows inert
    ours.set_live_rows(live)
    qkv = torch.randn(n_rows, 3, n_head, 64, device=device, dtype=dtype)
    q, k, v = qkv.unbind(1)  # views of one tensor, as Attention.qkv's
    positions = torch.randint(0, n_ctx, (n_rows,), device=device)
    positions[0] = 0  # a row that sees only its own token
    rows = torch.arange(n_rows, device=device)
    out = torch.empty_like(q)

    def step() -> None:
        ours.begin_step(positions, None)
        out.copy_(ours.write_and_attend(q, k, v, k_cache, v_cache, (rows, positions), None, positions, None))

    def check() -> None:
        want = ref.write_and_attend(q, k, v, want_k, want_v, (rows, positions), None, positions, None)
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # the same K/V, the same places
        used = live[:n_rows]
        torch.testing.assert_close(out[used].float(), want[used].float(), atol=2e-2, rtol=2e-2)
        assert torch.isfinite(out.float()).all()

    step()  # eager (compiles)
    check()
    graph = capture(step)
    for _ in range(2):  # new tokens at new positions, the same graph
        positions.copy_(torch.randint(0, n_ctx, (n_rows,), device=device))
        qkv.copy_(torch.randn_like(qkv))
        graph.replay()
        check()
