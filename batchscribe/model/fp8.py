"""fp8 (e4m3) GEMMs for the encoder: weights quantised once per output channel, activations per
token (one scale per row), both scales applied in the GEMM's epilogue.

On CUDA (sm_89 and later) the GEMM is `torch._scaled_mm` with row-wise scales. Elsewhere the same
arithmetic is emulated in float32 on the dequantised values, so the CPU path gives the fp8 encoder's
numbers (slowly) and the accuracy of fp8 can be measured on any machine.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# A row of zeros (padding) would give a zero scale and 0/0; any positive floor keeps it exact.
MIN_SCALE = 1e-12


def fp8_gemm_supported(device: torch.device) -> bool:
    """Hardware fp8 GEMMs: CUDA compute capability 8.9 (Ada) or 9.0+ (Hopper)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], float32 scales [M, 1]) with x ~= q * scale row by row."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = amax.clamp_min(MIN_SCALE) / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


class Fp8Weight:
    """A linear layer's weight [N, K] as e4m3 with one float32 scale per output channel, and its bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype):
        q, scale = quantize_rows(weight.detach())
        self.q = q  # [N, K] row-major: q.t() is the column-major operand _scaled_mm wants
        self.scale = scale.reshape(1, -1).contiguous()  # [1, N]
        self.bias = None if bias is None else bias.detach().to(out_dtype).contiguous()
        self.out_dtype = out_dtype
        self.hardware = fp8_gemm_supported(weight.device)

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    def __call__(self, a: torch.Tensor, a_scale: torch.Tensor) -> torch.Tensor:
        """a: [M, K] e4m3, a_scale: [M, 1] float32 -> [M, N] out_dtype (bias added)."""
        if self.hardware:
            return torch._scaled_mm(a, self.q.t(), scale_a=a_scale, scale_b=self.scale, bias=self.bias,
                                    out_dtype=self.out_dtype)  # fmt: skip
        out = (a.float() * a_scale) @ (self.q.float() * self.scale.t()).t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.out_dtype)
