"""The GPU libraries' one-time loading, started beside the model load.

In a fresh process each library loads its kernels on first use: Triton hashes its own install and
builds its launcher, cuBLAS, cuFFT and cuDNN load their modules. On the H200 host that is about a
second before the engine's own warm-up can start (docs/GPU_NOTES.md). A thread started as soon as
the device is resolved pays it while the main thread reads the tokenizer and the weights. The
engine joins it before its warm-up, so no two threads build Triton kernels at once; a failure here
is left for the real warm-up to raise, with its own context.
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
    """Touches cuBLAS, cuFFT, cuDNN, SDPA and (for the fused encoder) Triton once, in a thread."""

    def __init__(self, config: EngineConfig, dims: ModelDims):
        self.thread: threading.Thread | None = None
        if config.device.type == "cuda":
            self.thread = threading.Thread(target=self._touch, args=(config, dims), name="batchscribe-prewarm",
                                           daemon=True)  # fmt: skip
            self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    @staticmethod
    @torch.no_grad()
    def _touch(config: EngineConfig, dims: ModelDims) -> None:
        try:
            _touch_libraries(config.device, config.dtype, dims, fused=config.encoder != "eager")
        except Exception:  # noqa: BLE001  (the engine's warm-up runs the same calls and reports)
            pass


def library_steps(device: torch.device, dtype: torch.dtype, dims: ModelDims,
                  fused: bool) -> list[tuple[str, Callable[[], object]]]:  # fmt: skip
    """Each library's first use, in order, as (name, call): cuBLAS, cuFFT, cuDNN, SDPA, and Triton
    for the fused encoder. benchmarks/startup_libs.py times them one by one."""
    d, heads = dims.n_audio_state, dims.n_audio_head
    x = torch.zeros(8, d, device=device, dtype=dtype)  # [8, d]

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
        return encoder_triton.add_norm(x, None, None, torch.nn.LayerNorm(d, device=device, dtype=dtype), fp8=False)

    steps = [("cuBLAS (GEMM)", lambda: x @ x.t()), ("cuFFT (stft)", cufft), ("cuDNN (conv1d)", cudnn), ("SDPA", sdpa)]
    if fused and encoder_triton.triton_available():
        steps.append(("Triton (add_norm)", triton))
    return steps


def _touch_libraries(device: torch.device, dtype: torch.dtype, dims: ModelDims, fused: bool) -> None:
    for _, step in library_steps(device, dtype, dims, fused):
        step()
    torch.cuda.synchronize(device)
