"""The GPU libraries' one-time loading, started beside the model load.

In a fresh process each library loads its kernels on first use: Triton hashes its own install and
builds its launcher, cuBLAS, cuFFT and cuDNN load their modules. On the H200 host that is about a
second before the engine's own warm-up can start (docs/GPU_NOTES.md). Threads started as soon as
the device is resolved pay it while the main thread reads the tokenizer and the weights: one for
the CUDA libraries, one for Triton, whose hash of its own install (a few hundred MB, read and
hashed with the GIL released) would otherwise wait behind them. The engine joins both before its
warm-up, so no two threads build Triton kernels at once; a failure here is left for the real
warm-up to raise, with its own context.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from batchscribe.constants import HOP_LENGTH, N_FFT
from batchscribe.engine.setup import EngineConfig
from batchscribe.model import encoder_triton
from batchscribe.model.dims import ModelDims


class Prewarm:
    """Touches cuBLAS, cuFFT, cuDNN and SDPA in one thread and (for the fused encoder) Triton in
    another, once."""

    def __init__(self, config: EngineConfig, dims: ModelDims):
        self.threads: list[threading.Thread] = []
        if config.device.type != "cuda":
            return
        steps = library_steps(config.device, config.dtype, dims, fused=config.encoder != "eager")
        groups = {"cuda": [call for name, call in steps if not name.startswith("Triton")],
                  "triton": [call for name, call in steps if name.startswith("Triton")]}  # fmt: skip
        for name, calls in groups.items():
            if calls:
                thread = threading.Thread(target=self._touch, args=(config.device, calls),
                                          name=f"batchscribe-prewarm-{name}", daemon=True)  # fmt: skip
                thread.start()
                self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join()
        self.threads = []

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
