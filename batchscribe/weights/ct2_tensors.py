"""CTranslate2 Whisper variables -> Hugging Face WhisperForConditionalGeneration tensors.

No arithmetic is done on any tensor, so the fp16 weights stay bit for bit: fused projections are
only sliced by rows, and every CT2 variable is used exactly once.
"""

from __future__ import annotations

from typing import Sequence

import torch

from batchscribe.weights.ct2_format import Ct2FormatError, Ct2Model

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GELU = 3  # CTranslate2 ActivationType::GELU (exact erf GELU, HF "gelu")


class _Mapper:
    """Moves CT2 variables to HF names, each exactly once; fused ones are split by rows."""

    def __init__(self, model: Ct2Model) -> None:
        self.model = model
        self.unused = {n for n, v in model.variables.items() if v.dim() > 0}
        self.out: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        if name not in self.model.variables:
            raise Ct2FormatError(f"variable {name} is missing from the CTranslate2 model")
        if name not in self.unused:
            raise Ct2FormatError(f"variable {name} used twice")  # a mapping bug, not user data
        self.unused.discard(name)
        tensor = self.model.variables[name]
        if tensor.dtype not in _FLOAT_DTYPES:
            raise Ct2FormatError(
                f"variable {name} is {tensor.dtype} (a quantized model); convert the original "
                "checkpoint with ct2-transformers-converter --quantization float16 instead"
            )
        return tensor

    def put(self, hf_name: str, tensor: torch.Tensor) -> None:
        assert hf_name not in self.out, hf_name
        # clone: safetensors refuses tensors that share storage (row slices of one fused weight).
        self.out[hf_name] = tensor.clone()

    def linear(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.take(f"{ct2}/weight"))
        self.put(f"{hf}.bias", self.take(f"{ct2}/bias"))

    def norm(self, ct2: str, hf: str) -> None:
        self.put(f"{hf}.weight", self.take(f"{ct2}/gamma"))
        self.put(f"{hf}.bias", self.take(f"{ct2}/beta"))

    def fused(self, ct2: str, hf_prefix: str, parts: Sequence[str]) -> None:
        """Split a fused [len(parts) * d, d] projection; k_proj has no bias in HF Whisper."""
        fused = self.take(f"{ct2}/weight")  # [len(parts) * d, d]
        if fused.dim() != 2 or fused.shape[0] != len(parts) * fused.shape[1]:
            raise Ct2FormatError(f"{ct2}/weight has shape {list(fused.shape)}; expected [{len(parts)}*d, d]")
        weights = fused.chunk(len(parts), dim=0)  # each [d, d]
        biases = self.take(f"{ct2}/bias").chunk(len(parts), dim=0)  # each [d]
        for part, w, b in zip(parts, weights, biases):
            self.put(f"{hf_prefix}.{part}.weight", w)
            if part == "k_proj":
                if torch.count_nonzero(b).item() != 0:
                    raise Ct2FormatError(f"{ct2}/bias: the key part is not zero; HF k_proj has no bias")
            else:
                self.put(f"{hf_prefix}.{part}.bias", b)


def _map_layers(m: _Mapper, side: str) -> None:
    hf = f"model.{side}"
    m.put(f"{hf}.embed_positions.weight", m.take(f"{side}/position_encodings/encodings"))
    m.norm(f"{side}/layer_norm", f"{hf}.layer_norm")
    for i in range(m.model.layer_count(side)):
        src, dst = f"{side}/layer_{i}", f"{hf}.layers.{i}"
        m.fused(f"{src}/self_attention/linear_0", f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"))
        m.linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        m.norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        if side == "decoder":
            m.linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
            m.fused(f"{src}/attention/linear_1", f"{dst}.encoder_attn", ("k_proj", "v_proj"))
            m.linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
            m.norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        m.linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
        m.linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
        m.norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")


def ct2_to_hf_state_dict(model: Ct2Model) -> dict[str, torch.Tensor]:
    """HF WhisperForConditionalGeneration names (without the tied proj_out.weight)."""
    m = _Mapper(model)
    for side in ("encoder", "decoder"):
        _map_layers(m, side)
    m.linear("encoder/conv1", "model.encoder.conv1")
    m.linear("encoder/conv2", "model.encoder.conv2")
    m.put("model.decoder.embed_tokens.weight", m.take("decoder/embeddings/weight"))
    # The output projection must be tied to the embedding: HF Whisper has no separate proj_out.
    target = model.aliases.get("decoder/projection/weight")
    if target is None and "decoder/projection/weight" in model.variables:
        proj = m.take("decoder/projection/weight")
        if not torch.equal(proj, model.variables["decoder/embeddings/weight"]):
            raise Ct2FormatError("decoder/projection/weight differs from the embedding (untied)")
    elif target not in (None, "decoder/embeddings/weight"):
        raise Ct2FormatError(f"decoder/projection/weight aliases {target}, not the embedding")
    if m.unused:
        raise Ct2FormatError(f"unknown CTranslate2 variables (not a Whisper layout?): {sorted(m.unused)}")
    _check_structure(model)
    return m.out


def _check_structure(model: Ct2Model) -> None:
    expected = {"decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0}
    for name, want in expected.items():
        got = model.scalar(name, want)
        if got != want:
            raise Ct2FormatError(f"{name}={got}; HF Whisper needs {want}")
    act = model.scalar("decoder/activation", _GELU)
    if act != _GELU:
        raise Ct2FormatError(f"decoder/activation={act}; HF Whisper uses GELU ({_GELU})")
