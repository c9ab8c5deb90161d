"""Each row's probability of one token, from its logits, without forming the whole softmax.

Word probabilities need softmax(logits)[target] only. torch's softmax writes every row's float32
probabilities (four bytes per vocabulary entry) and reads them back for one value each; on CUDA one
Triton kernel instead reads the logits once, keeps an online maximum and sum in float32 (as torch's
softmax does) and writes one float per row. Elsewhere the softmax runs as before.
"""

from __future__ import annotations

import torch

from batchscribe.engine.dtw_device import on_device

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: torch's softmax runs instead
    triton = None

BLOCK = 4096  # vocabulary entries per loop iteration


def target_probs(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype), target [R] long in [0, V) -> softmax(logits[r])[target[r]]
    [R] float32, computed in float32. Only queues work on CUDA (graph-capturable)."""
    if not on_device(logits.device):
        return logits.softmax(dim=-1, dtype=torch.float32).gather(1, target[:, None])[:, 0]
    logits, target = logits.contiguous(), target.contiguous()
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        _target_prob[(logits.shape[0],)](logits, target, out, logits.shape[1], BLOCK=BLOCK, num_warps=8)
    return out


if triton is not None:

    # The vocabulary size is fixed per model but left unspecialised: one compilation for any.
    @triton.jit(do_not_specialize=["V"])
    def _target_prob(Logits, Target, Out, V, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        src = Logits + row * V
        lanes = tl.arange(0, BLOCK)
        top = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: the running maximum
        total = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp(x - top)
        for start in range(0, V, BLOCK):
            x = tl.load(src + start + lanes, mask=start + lanes < V, other=float("-inf")).to(tl.float32)
            new = tl.maximum(top, x)
            # A lane that has seen only padding keeps (-inf, 0): exp(-inf - -inf) would be NaN.
            seen = new > float("-inf")
            total = tl.where(seen, total * tl.exp(top - new) + tl.exp(x - new), 0.0)
            top = new
        peak = tl.max(top, axis=0)
        denominator = tl.sum(tl.where(top > float("-inf"), total * tl.exp(top - peak), 0.0), axis=0)
        picked = tl.load(src + tl.load(Target + row)).to(tl.float32)
        tl.store(Out + row, tl.exp(picked - peak) / denominator)
