"""The device DTW (engine/dtw_device.py): its skewed layout equals the host's, and its fill and walk
back (the Triton kernel under Triton's CPU interpreter, and compiled on a GPU) give the host's
paths (`batchscribe.dtw`, itself equal to openai's `dtw_cpu` in tests/test_dtw.py) for a padded
batch of windows, ties included. No openai-whisper here, so the GPU image runs it too."""

from __future__ import annotations

import pytest
import torch

from tests.marks import needs_cuda

CHECK = """
import numpy as np, torch
from batchscribe import dtw
from batchscribe.engine import dtw_device
SHAPES = [(1, 1), (3, 7), (12, 40), (40, 12), (25, 300), (2, 1), (1, 5), (70, 200)]
def check(device):
    rng = np.random.default_rng(3)
    for quantise in (False, True):
        xs = [rng.normal(size=s) for s in SHAPES]
        xs = [np.round(x) for x in xs] if quantise else xs
        n, m = max(s[0] for s in SHAPES), max(s[1] for s in SHAPES)
        pad = torch.full((len(xs), n, m), 5.0, dtype=torch.float64)  # padding a path must never take
        for b, x in enumerate(xs):
            pad[b, : x.shape[0], : x.shape[1]] = torch.from_numpy(x)
        pad = pad.to(device)
        np.testing.assert_array_equal(dtw_device.skew(pad, SHAPES).cpu().numpy(), dtw.skew(xs)[0])
        for x, (rows, cols) in zip(xs, dtw_device.paths(pad, SHAPES)):
            np.testing.assert_array_equal(np.stack([rows, cols]), np.stack(dtw.dtw(x)))
    print("ok")
"""


def test_the_kernel_in_the_interpreter_gives_the_hosts_paths(triton_interpreter) -> None:
    pytest.importorskip("triton")
    assert triton_interpreter(CHECK + "\ncheck('cpu')\n") == ["ok"]


def test_the_torch_skew_and_host_fill_give_the_hosts_paths() -> None:
    namespace: dict = {}
    exec(CHECK, namespace)  # no TRITON_INTERPRET here: on the CPU the host fill and walk run
    namespace["check"]("cpu")


@pytest.mark.gpu
@needs_cuda
def test_the_compiled_kernel_gives_the_hosts_paths() -> None:
    namespace: dict = {}
    exec(CHECK, namespace)
    namespace["check"](torch.device("cuda"))


@pytest.mark.parametrize("block", [64, 512])
def test_the_kernel_compiles_for_hopper(block: int) -> None:
    """Triton's own compiler, to an sm_90 cubin, on a machine without a GPU: what the interpreter
    cannot check (types of loop-carried values, scalar loads and stores in the walk)."""
    pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    target = pytest.importorskip("triton.backends.compiler").GPUTarget("cuda", 90, 32)
    from batchscribe.engine import dtw_device

    signature = {"Cost": "*fp64", "Total": "*fp32", "Trace": "*i8", "Shapes": "*i32", "PathRow": "*i32",
                 "PathCol": "*i32", "Steps": "*i32", "DIAGONALS": "i32", "WIDTH": "i32", "STEPS": "i32",
                 "BLOCK": "constexpr"}  # fmt: skip
    source = compiler.ASTSource(fn=dtw_device._dtw, signature=signature, constexprs={"BLOCK": block})
    assert compiler.compile(source, target=target).asm["cubin"]
