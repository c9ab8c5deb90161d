"""The encoder as the engine runs it on CUDA: the same arithmetic as AudioEncoder.forward in fewer
passes over the activations [M = windows x frames, d].

Per layer:
- q, k and v are one GEMM (k's missing bias is a zero slice);
- each residual add happens in the GEMM's accumulator (`addmm_` into the stream), and the bias add
  that follows is fused with the next layer norm (encoder_ops.add_norm);
- fc1's bias and GELU are cuBLASLt's epilogue (`_addmm_activation`, the tanh form of GELU).

With `fp8`, the four GEMMs take e4m3 operands (weights per channel, activations per token: fp8.py);
layer norm and GELU write their outputs quantised, attention stays in the model's dtype, and the
residual add moves into the norm kernel (a scaled GEMM has no accumulator input).

Attention is SDPA unless an `attention` kernel is given (attention/flashinfer_prefill.py: FA3 on
Hopper), which reads q, k and v in place from the QKV output and writes out_proj's layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchscribe.model.encoder_ops import add_norm, gelu_quant, quant_rows
from batchscribe.model.fp8 import Fp8Weight
from batchscribe.model.whisper import AudioEncoder, EncoderLayer


@dataclass
class _Pending:
    """The stream before its next layer norm: y (+ residual) (+ bias), summed by add_norm."""

    y: torch.Tensor
    residual: torch.Tensor | None = None
    bias: torch.Tensor | None = None


# (qkv [M = windows x frames, 3 d], windows) -> unmasked attention within each window, [M, d]
EncoderAttention = Callable[[torch.Tensor, int], torch.Tensor]
# The layers an fp8 encoder keeps in the model's dtype: the first, which reads the conv stem's
# output, is the most sensitive to fp8's rounding (its cost in half precision, by WER and identical
# transcripts, is in docs/GPU_NOTES.md); one layer of a large model's 32 is ~0.6 % of fp8's gain.
FP8_DENSE_LAYERS = (0,)


class _Layer:
    def __init__(self, layer: EncoderLayer, fp8: bool, attention: EncoderAttention | None = None):
        attn = layer.self_attn
        self.n_head = attn.n_head
        self.attention = attention
        self.ln1, self.ln2 = layer.self_attn_layer_norm, layer.final_layer_norm
        qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
        qkv_b = torch.cat([attn.q_proj.bias, torch.zeros_like(attn.q_proj.bias), attn.v_proj.bias]).detach()
        linears = {"qkv": (qkv_w, qkv_b), "out": (attn.out_proj.weight, attn.out_proj.bias),
                   "fc1": (layer.fc1.weight, layer.fc1.bias), "fc2": (layer.fc2.weight, layer.fc2.bias)}  # fmt: skip
        dtype = qkv_w.dtype
        self.fp8 = {name: Fp8Weight(w, b, dtype) for name, (w, b) in linears.items()} if fp8 else None
        if not fp8:  # weights transposed once: addmm's [K, N] operand
            self.w_t = {name: w.detach().t() for name, (w, _) in linears.items()}
            self.b = {name: b.detach() for name, (_, b) in linears.items()}

    def attend(self, qkv: torch.Tensor, batch: int) -> torch.Tensor:
        """qkv: [M, 3 d] -> unmasked attention over each window's frames, [M, d]."""
        if self.attention is not None:
            return self.attention(qkv, batch)
        m, three_d = qkv.shape
        heads = qkv.view(batch, m // batch, 3, self.n_head, three_d // (3 * self.n_head))
        q, k, v = (heads[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, T, hd]
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(m, three_d // 3)

    def __call__(self, pending: _Pending, batch: int) -> _Pending:
        """The previous sublayer's pending sum in, this layer's out (either kind follows either)."""
        return self.forward(pending, batch) if self.fp8 is None else self.forward_fp8(pending, batch)

    def forward(self, pending: _Pending, batch: int) -> _Pending:
        normed, _ = add_norm(pending.y, pending.residual, pending.bias, self.ln1, fp8=False)
        x = pending.y  # add_norm wrote the stream over y
        qkv = torch.addmm(self.b["qkv"], normed, self.w_t["qkv"])
        x.addmm_(self.attend(qkv, batch), self.w_t["out"])  # + out_proj's bias below
        normed, _ = add_norm(x, None, self.b["out"], self.ln2, fp8=False)
        hidden = torch._addmm_activation(self.b["fc1"], normed, self.w_t["fc1"], use_gelu=True)
        x.addmm_(hidden, self.w_t["fc2"])
        return _Pending(x, bias=self.b["fc2"])

    def forward_fp8(self, pending: _Pending, batch: int) -> _Pending:
        assert self.fp8 is not None
        q, scale = add_norm(pending.y, pending.residual, pending.bias, self.ln1, fp8=True)
        x = pending.y
        out = self.fp8["out"](*quant_rows(self.attend(self.fp8["qkv"](q, scale), batch)))
        q, scale = add_norm(out, x, None, self.ln2, fp8=True)  # out becomes the stream
        hidden = self.fp8["fc1"](q, scale)
        return _Pending(self.fp8["fc2"](*gelu_quant(hidden)), residual=out)


class FusedEncoder:
    """Callable like AudioEncoder: mel [B, n_mels, 3000] -> [B, n_audio_ctx, d]. Shares the
    module's conv stem, norms and (without fp8) nothing else: its GEMM weights are rearranged copies."""

    def __init__(self, encoder: AudioEncoder, fp8: bool = False, dense_layers: tuple[int, ...] = (),
                 attention: EncoderAttention | None = None):  # fmt: skip
        """dense_layers: with fp8, the layers that keep the model's dtype; attention: None for SDPA."""
        self.encoder, self.fp8 = encoder, fp8
        self.layers = [_Layer(layer, fp8 and i not in dense_layers, attention) for i, layer in enumerate(encoder.layers)]

    @torch.no_grad()
    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.encoder.stem(mel)  # [B, T, d] contiguous
        batch, frames, d = x.shape
        pending = _Pending(x.view(batch * frames, d))
        for layer in self.layers:
            pending = layer(pending, batch)
        out, _ = add_norm(pending.y, pending.residual, pending.bias, self.encoder.layer_norm, fp8=False)
        return out.view(batch, frames, d)
