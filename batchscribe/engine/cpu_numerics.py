"""Batch invariance on the CPU: MKL's reproducible mode, and a check that it took.

torch's CPU flash attention runs MKL GEMMs on per-thread scratch buffers, and MKL chooses its code
path by memory alignment unless its conditional numerical reproducibility mode is on (MKL_CBWR).
The threads' buffers are aligned differently, so a decode step's attention gives a row different
last bits depending on which thread computes it, i.e. on the row's place in the step: records then
depend on the batch. MKL reads MKL_CBWR at its first call in the process, so a batch-invariant run
asks for the mode before anything computes (`request_reproducible_mkl`, from the engine's
resolution, before the weights load), and the engine checks whether it took (`threads_agree`): in
a process that computed before, it steps with torch's math attention instead, slower but
invariant, and says how to get the fast path.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

REPRODUCIBLE = "AUTO,STRICT"  # MKL's own code path choice, results independent of alignment


def request_reproducible_mkl() -> None:
    """Ask MKL for reproducible results, unless the environment already says otherwise. Takes
    effect only if MKL has not been called yet in this process."""
    os.environ.setdefault("MKL_CBWR", REPRODUCIBLE)


@functools.cache
def threads_agree() -> bool:
    """Does the CPU's flash attention give the same result for the same work on every thread? One
    identical attention task per thread (a decode step's shape: one query over 1500 keys); MKL's
    mode cannot change after its first call, so the answer holds for the process."""
    threads = torch.get_num_threads()
    if threads == 1:
        return True
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 64, generator=gen) for n in (1, 1500, 1500))
    tasks = [t.expand(threads, 1, -1, -1).contiguous() for t in (q, k, v)]  # [threads, 1, n, 64]
    out = F.scaled_dot_product_attention(*tasks)
    return bool((out == out[:1]).all())
