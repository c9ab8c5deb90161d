"""The decode step's split-K projections (model/split_k.py) against F.linear and a float32 residual
add and layer norm rounded once: on the CPU through Triton's interpreter, and on a GPU compiled,
eagerly and replayed from a CUDA graph, alone and inside a large-v3-shaped decode step."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.marks import needs_cuda

pytest.importorskip("triton")

from batchscribe.model import split_k  # noqa: E402  (after the skip: the module imports Triton)

# Shared by both tests: run in a fresh interpreter process, or in this one on the GPU.
CHECK = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from batchscribe.model import split_k as sk

    def check(device, dtypes, graph, plans):
        torch.manual_seed(0)
        for dt in dtypes:
            tol = 1e-5 if dt == torch.float32 else 2e-2  # half precision: one unit in the last place
            # (rows, outputs, depth): a tail in every dimension, and K not a multiple of the split
            for m, n, k in ((37, 96, 1536), (64, 128, 640), (5, 96, 300)):
                lin = torch.nn.Linear(k, n).to(device=device, dtype=dt)
                norm = torch.nn.LayerNorm(n).to(device=device, dtype=dt)
                torch.nn.init.normal_(norm.weight), torch.nn.init.normal_(norm.bias)
                x = torch.randn(m, k, device=device).to(dt)
                r = torch.randn(m, n, device=device).to(dt)
                for p in plans:
                    stream, normed = graph(lambda: sk.project_add_norm(lin, x, r, norm, p))
                    s_ref, n_ref = sk.reference(lin, x, r, norm)
                    torch.testing.assert_close(stream.float(), s_ref.float(), rtol=tol, atol=tol)
                    torch.testing.assert_close(normed.float(), n_ref.float(), rtol=tol, atol=tol)
                    y = graph(lambda: sk.project(lin, x, p))
                    ref = F.linear(x.float(), lin.weight.float(), lin.bias.float())
                    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())
                    assert stream.dtype == normed.dtype == y.dtype == dt
        print("ok")

    def eager(fn):
        return fn()
    """
)
# Tiles small enough for the interpreter; 2-5 K ranges, one ending short of BLOCK_K.
PLANS = "[sk.Plan(2, 32, 32, 64, 4, 2), sk.Plan(5, 32, 64, 32, 4, 2)]"


def test_split_k_matches_the_reference_in_the_interpreter(triton_interpreter) -> None:
    # The interpreter's tl.dot gives garbage for bfloat16 (float32 and float16 are exact there):
    # bfloat16 is checked on the GPU.
    script = CHECK + f"\ncheck('cpu', (torch.float32, torch.float16), eager, {PLANS})\n"
    assert triton_interpreter(script) == ["ok"]


def test_the_split_fills_the_gpu_where_cublas_would_not() -> None:
    # large-v3's step at 256 rows: 80 output tiles for out_proj, so K splits into ranges of 256
    assert split_k.split_for(256, 1280, 1280) == 5
    assert split_k.split_for(256, 1280, 5120) == 6  # fc2: 512 // 80 programs a tile
    assert split_k.split_for(512, 1280, 5120) == 1  # 160 tiles: cuBLAS fills the GPU
    # enough tiles (qkv, fc1, the logits), or K too shallow to split (tiny.en's out_proj): cuBLAS
    assert split_k.split_for(256, 3 * 1280, 1280) == 1
    assert split_k.split_for(256, 51872, 1280) == 1
    assert split_k.split_for(256, 384, 384) == 1
    assert split_k.split_for(256, 384, 1536) == 6  # tiny.en's fc2


def test_off_cuda_the_step_keeps_f_linear(monkeypatch) -> None:
    lin, norm = torch.nn.Linear(1280, 1280), torch.nn.LayerNorm(1280)
    x, r = torch.randn(256, 1280), torch.randn(256, 1280)
    assert split_k.plan(x, lin) is None
    monkeypatch.setattr(split_k, "_partials", lambda *a: pytest.fail("split-K ran on the CPU"))
    stream, normed = split_k.project_add_norm(lin, x, r.clone(), norm)
    torch.testing.assert_close(stream, lin(x) + r)
    torch.testing.assert_close(normed, norm(lin(x) + r))


def _graphed(fn):
    """fn captured in a CUDA graph and replayed: the replay's outputs (its inputs are unchanged)."""
    from tests.attention.helpers import capture

    out = []
    graph = capture(lambda: out.append(fn()))
    graph.replay()
    torch.cuda.synchronize()
    return out[-1]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("in_graph", [False, True])
def test_split_k_matches_the_reference_on_the_gpu(in_graph) -> None:
    scope: dict = {}
    exec(CHECK, scope)
    plans = eval(PLANS, {"sk": split_k}) + [split_k.Plan(4), split_k.Plan(6, 64, 128, 64, 4, 4)]
    scope["check"]("cuda", (torch.float32, torch.float16, torch.bfloat16), _graphed if in_graph else scope["eager"], plans)


@pytest.mark.gpu
@needs_cuda
def test_a_large_v3_shaped_step_takes_the_split_and_matches_f_linear() -> None:
    """The shapes the engine's step gives split_k (256 rows of large-v3): plan picks the split, and
    the result equals F.linear followed by the eager add and norm within bf16's rounding."""
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    for n, k in ((1280, 1280), (1280, 5120)):
        lin = torch.nn.Linear(k, n).to(dev, dt)
        norm = torch.nn.LayerNorm(n).to(dev, dt)
        x, r = torch.randn(256, k, device=dev, dtype=dt), torch.randn(256, n, device=dev, dtype=dt)
        assert split_k.plan(x, lin) == split_k.Plan(split_k.split_for(256, n, k))
        stream, normed = _graphed(lambda: split_k.project_add_norm(lin, x, r, norm))
        eager = lin(x) + r
        torch.testing.assert_close(stream, eager, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(normed, norm(eager), rtol=3e-2, atol=3e-2)
