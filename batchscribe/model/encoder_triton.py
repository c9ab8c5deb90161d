"""Triton kernels for the fused encoder's memory-bound passes, one program per row of [M, D]:

- `add_norm`: s = y (+ residual) (+ bias), stored in place over y; then LayerNorm(s), written in the
  model's dtype or as e4m3 with one scale per row (the next fp8 GEMM's input); the decoder's step
  (model/whisper.py) runs its residual adds and layer norms through it too;
- `gelu_quant`: GELU of fc1's output (its tanh form, as cuBLASLt's epilogue computes it for the
  half-precision encoder; the erf form on request), quantised per row for fc2;
- `quant_rows`: per-row e4m3 quantisation (the attention output, for out_proj).

Each replaces two or three eager passes over the activations with one. encoder_ops.py holds the
eager reference each is tested against, and picks between them.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: encoder_ops uses the eager reference there
    triton = None

def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _quant_store(x, out_ptr, scale_ptr, row, cols, mask):
        amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0)
        scale = tl.maximum(amax, 1e-12) / 448.0  # e4m3's largest finite value; fp8.py's MIN_SCALE
        # One division a row, then a product per element: an IEEE division is a dozen instructions,
        # and these passes run well below the memory roof. (It may differ from x / scale in the
        # last float32 bit, so an e4m3 value may move one step where that bit decides its rounding.)
        q = tl.clamp(x * (1.0 / scale), -448.0, 448.0)
        tl.store(out_ptr + cols, q.to(tl.float8e4nv), mask=mask)
        tl.store(scale_ptr + row, scale)

    @triton.jit
    def _add_norm_kernel(y_ptr, res_ptr, bias_ptr, w_ptr, b_ptr, out_ptr, scale_ptr, D, eps,
                         HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, FP8: tl.constexpr,
                         BLOCK: tl.constexpr):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        y = tl.load(y_ptr + row * D + cols, mask=mask, other=0.0)
        s = y.to(tl.float32)
        if HAS_RES:
            s += tl.load(res_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            s += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES or HAS_BIAS:
            stored = s.to(y.dtype)  # the residual stream keeps the model's dtype, as in eager
            tl.store(y_ptr + row * D + cols, stored, mask=mask)
            s = stored.to(tl.float32)
        mean = tl.sum(s, axis=0) / D
        diff = tl.where(mask, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / D + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        n = diff * rstd * w + b
        if FP8:
            _quant_store(n, out_ptr + row * D, scale_ptr, row, cols, mask)
        else:
            tl.store(out_ptr + row * D + cols, n.to(y.dtype), mask=mask)

    @triton.jit
    def _gelu(h):
        """Exact (erf) GELU, with erf to within 1.5e-7 (Abramowitz and Stegun 7.1.26): its output is
        quantised to e4m3's 3 mantissa bits, and libdevice's erf costs several times the
        instructions in a pass that runs well below the memory roof."""
        z = tl.abs(h) * 0.7071067811865476
        t = tl.fdiv(1.0, 1.0 + 0.3275911 * z, ieee_rounding=False)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        erf = 1.0 - poly * tl.exp(-z * z)  # erf(|h| / sqrt(2))
        return 0.5 * h * (1.0 + tl.where(h < 0, -erf, erf))

    @triton.jit
    def _gelu_tanh(h):
        """GELU's tanh form, cuBLASLt's epilogue (the fused half-precision encoder's fc1): 0.5 h (1 +
        tanh(u)) = h * sigmoid(2 u), u = sqrt(2 / pi) (h + 0.044715 h^3); one exp2 and one fast
        division an element. Large |h| gives h or -0, as it should."""
        z = -2.302208198 * (h + 0.044715 * h * h * h)  # -2 u log2(e): exp2(z) = exp(-2 u)
        return tl.fdiv(h, 1.0 + tl.exp2(z), ieee_rounding=False)

    @triton.jit
    def _gelu_form(h, TANH: tl.constexpr):
        if TANH:
            return _gelu_tanh(h)
        return _gelu(h)

    @triton.jit
    def _gelu_quant_kernel(h_ptr, out_ptr, scale_ptr, D, BLOCK: tl.constexpr, TANH: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        g = _gelu_form(tl.load(h_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32), TANH)
        _quant_store(g, out_ptr + row * D, scale_ptr, row, cols, mask)

    @triton.jit
    def _gelu_quant_chunked_kernel(h_ptr, out_ptr, scale_ptr, D, CHUNK: tl.constexpr, TANH: tl.constexpr):
        """The row in CHUNK-wide pieces, twice: the amax, then the quantised values (the second
        read hits the cache). No lanes idle on a row that is not a power of two wide."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, CHUNK)
        amax = tl.zeros([CHUNK], dtype=tl.float32)
        for start in range(0, D, CHUNK):
            mask = start + cols < D
            g = _gelu_form(tl.load(h_ptr + row * D + start + cols, mask=mask, other=0.0).to(tl.float32), TANH)
            amax = tl.maximum(amax, tl.where(mask, tl.abs(g), 0.0))
        scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
        inv = 1.0 / scale  # see _quant_store
        for start in range(0, D, CHUNK):
            mask = start + cols < D
            g = _gelu_form(tl.load(h_ptr + row * D + start + cols, mask=mask, other=0.0).to(tl.float32), TANH)
            q = tl.clamp(g * inv, -448.0, 448.0)
            tl.store(out_ptr + row * D + start + cols, q.to(tl.float8e4nv), mask=mask)
        tl.store(scale_ptr + row, scale)

    @triton.jit
    def _quant_rows_kernel(x_ptr, out_ptr, scale_ptr, D, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        _quant_store(x, out_ptr + row * D, scale_ptr, row, cols, mask)


def _launch(d: int) -> dict[str, int]:
    block = triton.next_power_of_2(d)
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8}


def add_norm(y: torch.Tensor, residual: torch.Tensor | None, bias: torch.Tensor | None, norm: torch.nn.LayerNorm,
             fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """y, residual: [M, D] contiguous. y becomes the stream s; returns (normed or e4m3, scales)."""
    m, d = y.shape
    out = torch.empty(m, d, device=y.device, dtype=torch.float8_e4m3fn if fp8 else y.dtype)
    scale = torch.empty(m, 1, device=y.device, dtype=torch.float32) if fp8 else None
    _add_norm_kernel[(m,)](y, y if residual is None else residual, y if bias is None else bias, norm.weight,
                           norm.bias, out, out if scale is None else scale, d, norm.eps,
                           HAS_RES=residual is not None, HAS_BIAS=bias is not None, FP8=fp8,
                           **_launch(d))  # fmt: skip
    return out, scale


# gelu_quant's launch: (chunk, warps, tanh form); chunk 0 is the whole row in one block. Chosen by
# measurement (benchmarks/encoder_speed.py; docs/GPU_NOTES.md): the erf form's arithmetic, not
# memory, bounded the pass.
GELU_LAUNCH = (0, 8, True)


def gelu_quant(h: torch.Tensor, launch: tuple[int, int, bool] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, N] -> GELU(h) as e4m3 with per-row scales: the exact (erf) form, or with launch[2]
    the tanh form."""
    m, d = h.shape
    chunk, warps, tanh = launch or GELU_LAUNCH
    out = torch.empty(m, d, device=h.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty(m, 1, device=h.device, dtype=torch.float32)
    if chunk:
        _gelu_quant_chunked_kernel[(m,)](h, out, scale, d, CHUNK=chunk, TANH=tanh, num_warps=warps)
    else:
        _gelu_quant_kernel[(m,)](h, out, scale, d, BLOCK=triton.next_power_of_2(d), TANH=tanh, num_warps=warps)
    return out, scale


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, d = x.shape
    out = torch.empty(m, d, device=x.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty(m, 1, device=x.device, dtype=torch.float32)
    _quant_rows_kernel[(m,)](x, out, scale, d, **_launch(d))
    return out, scale
