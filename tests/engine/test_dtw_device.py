"""The device DTW (engine/dtw_device.py): the Triton kernel's fill and walk back under Triton's CPU
interpreter against openai-whisper's `dtw_cpu`; compiled, on a GPU, against the host path (itself
equal to `dtw_cpu`: tests/test_dtw.py), so the GPU image, which lacks openai-whisper, runs it; and
compiled by Triton's own compiler to an sm_90 cubin on a machine without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from batchscribe.engine import dtw_device
from tests.marks import needs_cuda
from tests.test_dtw import SHAPES, padded

INTERPRETED = """
import numpy as np
from whisper.timing import dtw_cpu
from batchscribe.engine import dtw_device
from tests.test_dtw import SHAPES, padded
for quantise in (False, True):
    xs, batch = padded(3, quantise)
    for x, (rows, cols) in zip(xs, dtw_device.paths(batch, SHAPES)):
        np.testing.assert_array_equal(np.stack([rows, cols]), dtw_cpu(x))
print("ok")
"""


def test_the_kernel_in_the_interpreter_gives_openais_paths(triton_interpreter) -> None:
    pytest.importorskip("triton")
    pytest.importorskip("whisper.timing")
    assert triton_interpreter(INTERPRETED) == ["ok"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("quantise", [False, True])
def test_the_compiled_kernel_gives_the_hosts_paths(quantise: bool) -> None:
    _, batch = padded(4, quantise)
    host = dtw_device.paths(batch, SHAPES)
    for (rows, cols), (want_rows, want_cols) in zip(dtw_device.paths(batch.cuda(), SHAPES), host):
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(cols, want_cols)


@pytest.mark.parametrize("block", [64, 512])
def test_the_kernel_compiles_for_hopper(block: int) -> None:
    """What the interpreter cannot check: types of loop-carried values, scalar loads and stores in
    the walk."""
    pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    target = pytest.importorskip("triton.backends.compiler").GPUTarget("cuda", 90, 32)
    signature = {"Cost": "*fp64", "Trace": "*i8", "Shapes": "*i32", "PathRow": "*i32",
                 "PathCol": "*i32", "Steps": "*i32", "DIAGONALS": "i32", "WIDTH": "i32", "STEPS": "i32",
                 "BLOCK": "constexpr"}  # fmt: skip
    source = compiler.ASTSource(fn=dtw_device._dtw, signature=signature, constexprs={"BLOCK": block})
    assert compiler.compile(source, target=target).asm["cubin"]
