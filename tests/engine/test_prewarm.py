"""engine/prewarm.py: the GPU libraries' first calls in a thread beside the model load."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from batchscribe.config import ConfigError, EngineOptions
from batchscribe.engine import prewarm
from batchscribe.engine.prewarm import Prewarm, library_steps
from batchscribe.engine.setup import resolve_engine
from batchscribe.model.dims import ModelDims
from tests.marks import gpu

TINY = ModelDims(n_mels=80, n_vocab=51864, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                 n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)  # fmt: skip


def test_on_the_cpu_no_thread_is_started() -> None:
    warm = Prewarm(torch.device("cpu"), torch.float32, TINY, fused=False)
    assert warm.threads == []
    warm.join()  # joining nothing is fine, and so is joining twice
    warm.join()


def test_start_is_once_per_process_for_a_device_dtype_and_model_shape() -> None:
    """run() starts it early and the Transcriber's call finds the same one; another model shape or
    dtype gets its own. The engine options are resolved as resolve_engine does, errors included."""
    first = prewarm.start(EngineOptions(device="cpu"), TINY)
    assert prewarm.start(EngineOptions(device="cpu", batch_size=4), TINY) is first  # slots don't matter
    assert prewarm.start(EngineOptions(device="cpu"), dataclasses.replace(TINY, n_audio_state=512)) is not first
    assert prewarm.start(EngineOptions(device="cpu", dtype="bfloat16"), TINY) is not first
    assert first.threads == []  # the CPU needs no loading
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            prewarm.start(EngineOptions(device="cuda"), TINY)


def test_each_library_step_runs_on_the_cpu_too() -> None:
    """The steps (which benchmarks/startup_libs.py times one by one) are plain torch calls: on the
    CPU all but Triton's run, and give the shapes the model's layers would."""
    steps = dict(library_steps(torch.device("cpu"), torch.float32, TINY, fused=False))
    assert list(steps) == ["cuBLAS (GEMM)", "cuFFT (stft)", "cuDNN (conv1d)", "SDPA"]
    assert steps["cuBLAS (GEMM)"]().shape == (8, 8)
    assert steps["cuDNN (conv1d)"]().shape == (1, TINY.n_audio_state, 16)
    assert steps["SDPA"]().shape == (1, TINY.n_audio_head, 16, TINY.n_audio_state // TINY.n_audio_head)
    assert steps["cuFFT (stft)"]().is_complex()


def test_triton_warms_beside_the_cuda_libraries_not_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's first call (its install's hash) must not queue behind cuBLAS, cuFFT, cuDNN and SDPA:
    here the CUDA libraries' first step waits until Triton's step has run, which only a second
    thread can do. The steps are stand-ins; the device is never touched."""
    triton_ran, ran = threading.Event(), []

    def cuda_step() -> None:
        ran.append(("cuda", threading.current_thread().name, triton_ran.wait(timeout=10)))

    def triton_step() -> None:
        ran.append(("triton", threading.current_thread().name, True))
        triton_ran.set()

    steps = [("cuBLAS (GEMM)", cuda_step), ("SDPA", lambda: ran.append(("sdpa", threading.current_thread().name, True))),
             ("Triton (add_norm)", triton_step)]  # fmt: skip
    monkeypatch.setattr(prewarm, "library_steps", lambda *a, **k: steps)
    warm = Prewarm(torch.device("cuda"), torch.float16, TINY, fused=True)  # synchronize fails: swallowed
    assert [t.name for t in warm.threads] == ["batchscribe-prewarm-cuda", "batchscribe-prewarm-triton"]
    warm.join()
    assert warm.threads == []
    assert sorted(ran) == [("cuda", "batchscribe-prewarm-cuda", True), ("sdpa", "batchscribe-prewarm-cuda", True),
                           ("triton", "batchscribe-prewarm-triton", True)]  # fmt: skip


def _exit_during_start_up(step_body: str, exit_wait: float = 60.0) -> None:
    """A fresh process starts Prewarm (on a pretended GPU) with one stand-in step and exits at once."""
    script = f"""
import pathlib, threading, time, torch
from batchscribe.config import EngineOptions
from batchscribe.engine import prewarm
from batchscribe.model.dims import ModelDims

def step():
    {step_body}

prewarm.library_steps = lambda *a, **k: [("cuBLAS (GEMM)", step)]
prewarm.resolve_compute = lambda options: (torch.device("cuda"), torch.float16, "fused")
prewarm.EXIT_WAIT_SECONDS = {exit_wait}
warm = prewarm.start(EngineOptions(), ModelDims(**{dataclasses.asdict(TINY)!r}))
assert len(warm.threads) == 1
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_a_process_that_exits_during_start_up_waits_for_the_loading_threads(tmp_path: Path) -> None:
    """The threads are daemons (a run never waits on them by mistake), so without the exit hook a
    process that stops right after start() (a usage error, nothing left to do) would leave them
    inside the libraries as it unloads them. Here a stand-in step outlives the main thread."""
    marker = tmp_path / "step-finished"
    _exit_during_start_up(f"time.sleep(0.5); pathlib.Path({str(marker)!r}).write_text('done')")
    assert marker.read_text() == "done"
    # A step that never returns delays the exit by EXIT_WAIT_SECONDS at most (else the 60 s timeout fails it).
    _exit_during_start_up("threading.Event().wait()", exit_wait=0.5)


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_library_calls_run_on_cuda(dtype: str) -> None:
    """Called directly: Prewarm's threads swallow errors (the engine's own warm-up reports them), so
    this is where a broken call would show."""
    config = resolve_engine(EngineOptions(device="cuda", dtype=dtype), TINY)
    fused = config.encoder != "eager"
    steps = library_steps(config.device, config.dtype, TINY, fused=fused)
    for _, call in steps:
        call()
    torch.cuda.synchronize()
    assert any(name.startswith("Triton") for name, _ in steps) == fused
    warm = Prewarm(config.device, config.dtype, TINY, fused)
    assert len(warm.threads) == 1 + fused
    warm.join()
    assert warm.threads == []
    assert torch.cuda.is_initialized()
