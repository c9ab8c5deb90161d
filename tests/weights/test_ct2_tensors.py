"""CT2 variables -> HF tensors: each stored HF tensor reproduces its CT2 variable bit for bit."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from batchscribe.weights.ct2_format import read_ct2
from tests.weights.helpers import ct2_pieces, installed_package_dirs, raw_bytes


def _refuse(name: str, hf: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    """Rebuild one CT2 variable from HF tensors (the inverse mapping, written independently)."""

    def get(key: str) -> torch.Tensor:
        used.add(key)
        return hf[key]

    side, rest = name.split("/", 1)
    pre = f"model.{side}"
    leaf = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
    if rest == "position_encodings/encodings":
        return get(f"{pre}.embed_positions.weight")
    if rest in ("embeddings/weight", "projection/weight"):
        return get(f"{pre}.embed_tokens.weight")
    if m := re.fullmatch(r"(conv[12]|layer_norm)/(\w+)", rest):
        return get(f"{pre}.{m.group(1)}.{leaf[m.group(2)]}")
    m = re.fullmatch(r"layer_(\d+)/(\w+)/(\w+)/(\w+)", rest)
    assert m, name
    layer, block, sub, kind = m.groups()
    lp = f"{pre}.layers.{layer}"
    attn = {"self_attention": "self_attn", "attention": "encoder_attn"}.get(block)
    if sub == "layer_norm":
        norm = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm", "ffn": "final_layer_norm"}
        return get(f"{lp}.{norm[block]}.{leaf[kind]}")
    if block == "ffn":
        return get(f"{lp}.{ {'linear_0': 'fc1', 'linear_1': 'fc2'}[sub]}.{kind}")
    fused = {
        ("self_attn", "linear_0"): ["q_proj", "k_proj", "v_proj"],
        ("self_attn", "linear_1"): ["out_proj"],
        ("encoder_attn", "linear_0"): ["q_proj"],
        ("encoder_attn", "linear_1"): ["k_proj", "v_proj"],
        ("encoder_attn", "linear_2"): ["out_proj"],
    }[(attn, sub)]
    pieces = []
    for proj in fused:
        key = f"{lp}.{attn}.{proj}.{kind}"
        if proj == "k_proj" and kind == "bias":  # HF k_proj has no bias: CT2 stores zeros
            pieces.append(torch.zeros_like(hf[f"{lp}.{attn}.q_proj.bias"]))
        else:
            pieces.append(get(key))
    return torch.cat(pieces, dim=0)


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_converted_tensors_reproduce_every_ct2_variable(name: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(f"{name.replace('.', '_')}_dir")
    model = read_ct2(ct2_pieces(installed_package_dirs(name)))
    hf = load_file(str(folder / "model.safetensors"))
    used: set[str] = set()
    for ct2_name, tensor in model.variables.items():
        if tensor.dim() == 0:
            continue  # structure scalars (num_heads, activation, ...) are checked via the config
        rebuilt = _refuse(ct2_name, hf, used)
        assert rebuilt.dtype == tensor.dtype == torch.float16, ct2_name
        assert rebuilt.shape == tensor.shape, ct2_name
        assert raw_bytes(rebuilt) == raw_bytes(tensor), ct2_name
    assert used == set(hf), sorted(set(hf) ^ used)  # every stored HF tensor came from CT2 data
    for key in hf:  # HF k_proj really has no bias: the fused CT2 key part was zero
        assert not key.endswith("k_proj.bias")
