"""The encoder's self-attention through FlashInfer's FA3 prefill kernel (Hopper only; the `gpu` extra).

Every window attends over its own n_audio_ctx frames, unmasked: a ragged batch whose sequences all
have one length. q, k and v are read in place from the fused encoder's QKV GEMM output
`[M = windows x frames, 3, H, D]` (strided views, no copies), and the output `[M, H, D]` is already
the layout out_proj takes, where SDPA wants heads first and transposes. FA3 was the fastest kernel
measured on the H200 for these shapes (docs/GPU_NOTES.md).

A FlashInfer plan is host work (it writes the schedule into the wrapper's buffers), so each
admission chunk size gets its own wrapper, planned once before the encoder graphs are captured; a
captured graph then reads that plan on every replay.
"""

from __future__ import annotations

from typing import Any

import torch

from batchscribe.attention.flashinfer import WORKSPACE_BYTES

HOPPER = 9  # FA3 is built for compute capability 9.x (sm90a)


def fa3_supported(device: torch.device) -> bool:
    """FA3's kernels run on this device (a Hopper GPU)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == HOPPER


class FlashInferEncoderAttention:
    """`(qkv [M, 3 d], windows) -> [M, d]`: unmasked attention within each window of `frames` frames."""

    def __init__(self, device: torch.device, dtype: torch.dtype, n_head: int, head_dim: int, frames: int):
        if not fa3_supported(device):
            raise ValueError(f"FlashInfer's FA3 prefill runs on Hopper GPUs (compute capability 9.x), not "
                             f"{device}; use the sdpa encoder kernel")  # fmt: skip
        import flashinfer

        self.flashinfer, self.device, self.dtype = flashinfer, device, dtype
        self.n_head, self.head_dim, self.frames = n_head, head_dim, frames
        # Split-KV partials, FlashInfer's recommended size; one for every chunk size's wrapper, whose
        # runs are ordered on the stream that encodes (the decoder's wrappers keep their own).
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.planned: dict[int, Any] = {}  # windows -> flashinfer.BatchPrefillWithRaggedKVCacheWrapper

    def prepare(self, windows: int) -> None:
        """Plan the kernel for chunks of `windows` windows (outside any CUDA graph)."""
        if windows in self.planned:
            return
        indptr = torch.arange(0, windows * self.frames + 1, self.frames, dtype=torch.int32)  # [windows + 1]
        wrapper = self.flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=indptr.to(self.device),
            kv_indptr_buf=indptr.to(self.device), backend="fa3",
        )  # fmt: skip
        wrapper.plan(indptr, indptr, self.n_head, self.n_head, self.head_dim, causal=False,
                     q_data_type=self.dtype, kv_data_type=self.dtype)  # fmt: skip
        self.planned[windows] = wrapper

    def __call__(self, qkv: torch.Tensor, windows: int) -> torch.Tensor:
        m = qkv.shape[0]
        if windows not in self.planned:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"FA3 encoder attention: chunks of {windows} windows were not planned before "
                                   "the capture; call prepare() first (WindowEncoder.warm_up does)")  # fmt: skip
            self.prepare(windows)
        heads = qkv.view(m, 3, self.n_head, self.head_dim)
        out = self.planned[windows].run(heads[:, 0], heads[:, 1], heads[:, 2])  # [M, H, D]
        return out.view(m, self.n_head * self.head_dim)
