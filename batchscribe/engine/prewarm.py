"""The GPU libraries' one-time loading, started beside the model load.

In a fresh process each library loads its kernels on first use: Triton hashes its own install and
builds its launcher, cuBLAS, cuFFT and cuDNN load their modules. On the H200 host that is about a
second before the engine's own warm-up can start (docs/GPU_NOTES.md). Threads started as soon as
the device is resolved pay it while the main thread reads the tokenizer, resolves the attention
kernels (FlashInfer's import) and loads the weights: one for the CUDA libraries, one for Triton,
whose hash of its own install (a few hundred MB, read and hashed with the GIL released) would
otherwise wait behind them. The engine joins both before its warm-up, so no two threads build
Triton kernels at once; a failure here is left for the real warm-up to raise, with its own context.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from batchscribe.config import EngineOptions
from batchscribe.constants import HOP_LENGTH, N_FFT
from batchscribe.engine.setup import resolve_compute
from batchscribe.model import encoder_triton
from batchscribe.model.dims import ModelDims

_Key = tuple[torch.device, torch.dtype, ModelDims, bool]
_STARTED: dict[_Key, Prewarm] = {}
_LOCK = threading.Lock()
EXIT_WAIT_SECONDS = 60.0  # the libraries' loading takes ~1-3 s on a fresh machine (docs/GPU_NOTES.md)


def start(options: EngineOptions, dims: ModelDims) -> Prewarm:
    """This process's Prewarm for the device, dtype and encoder `options` resolve to and the
    model's shape, started at the first call: run() calls it before the tokenizer loads and the
    attention kernels resolve, and the Transcriber's own call then finds it. Raises resolve_engine's
    ConfigErrors for those three options."""
    device, dtype, encoder = resolve_compute(options)
    key = (device, dtype, dims, encoder != "eager")
    with _LOCK:
        if key not in _STARTED:
            _STARTED[key] = Prewarm(*key)
        return _STARTED[key]


@atexit.register
def _join_started() -> None:
    # A process that stops during start-up (a usage error found after the start, nothing left to
    # do, Ctrl-C) waits for the loading threads rather than unloading libraries they are inside;
    # a bounded wait, so a library that never returns cannot keep the process from exiting.
    for warm in list(_STARTED.values()):
        warm.join(timeout=EXIT_WAIT_SECONDS)


class Prewarm:
    """Touches cuBLAS, cuFFT, cuDNN and SDPA in one thread and (for the fused encoder) Triton in
    another, once."""

    def __init__(self, device: torch.device, dtype: torch.dtype, dims: ModelDims, fused: bool):
        self.threads: list[threading.Thread] = []
        if device.type != "cuda":
            return
        steps = library_steps(device, dtype, dims, fused)
        groups = {"cuda": [call for name, call in steps if not name.startswith("Triton")],
                  "triton": [call for name, call in steps if name.startswith("Triton")]}  # fmt: skip
        for name, calls in groups.items():
            if calls:
                thread = threading.Thread(target=self._touch, args=(device, calls), name=f"batchscribe-prewarm-{name}",
                                          daemon=True)  # fmt: skip
                thread.start()
                self.threads.append(thread)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads (at most `timeout` seconds each, at exit)."""
        for thread in self.threads:
            thread.join(timeout)
        self.threads = [t for t in self.threads if t.is_alive()]

    @staticmethod
    @torch.no_grad()
    def _touch(device: torch.device, calls: list[Callable[[], object]]) -> None:
        try:
            for call in calls:
                call()
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001  (the engine's warm-up runs the same calls and reports)
            pass


def library_steps(device: torch.device, dtype: torch.dtype, dims: ModelDims,
                  fused: bool) -> list[tuple[str, Callable[[], object]]]:  # fmt: skip
    """Each library's first use, in order, as (name, call): cuBLAS, cuFFT, cuDNN, SDPA, and Triton
    for the fused encoder. Nothing touches the device before a call runs (Prewarm runs them in its
    threads). benchmarks/startup_libs.py times them one by one."""
    d, heads = dims.n_audio_state, dims.n_audio_head

    def x() -> torch.Tensor:  # [8, d]
        return torch.zeros(8, d, device=device, dtype=dtype)

    def cufft() -> object:
        window = torch.hann_window(N_FFT, device=device)
        return torch.stft(torch.zeros(1, 4 * N_FFT, device=device), N_FFT, HOP_LENGTH, window=window, return_complex=True)

    def cudnn() -> object:
        return F.conv1d(torch.zeros(1, dims.n_mels, 16, device=device, dtype=dtype),
                        torch.zeros(d, dims.n_mels, 3, device=device, dtype=dtype), padding=1)  # fmt: skip

    def sdpa() -> object:
        q = torch.zeros(1, heads, 16, d // heads, device=device, dtype=dtype)  # [B, H, T, hd]
        return F.scaled_dot_product_attention(q, q, q)

    def triton() -> object:  # Triton's own start-up, then this kernel
        return encoder_triton.add_norm(x(), None, None, torch.nn.LayerNorm(d, device=device, dtype=dtype), fp8=False)

    def gemm() -> torch.Tensor:
        a = x()
        return a @ a.t()

    steps = [("cuBLAS (GEMM)", gemm), ("cuFFT (stft)", cufft), ("cuDNN (conv1d)", cudnn), ("SDPA", sdpa)]
    if fused and encoder_triton.triton_available():
        steps.append(("Triton (add_norm)", triton))
    return steps
