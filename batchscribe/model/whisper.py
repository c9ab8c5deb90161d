"""Whisper encoder-decoder written for static caches and CUDA-graph capture.

Parameter names follow Hugging Face's `WhisperModel` (`encoder.layers.0.self_attn.q_proj.weight`,
...) so a Hugging Face state dict loads directly once its `model.` prefix is removed. Unlike the
openai/whisper and transformers modules, the decoder never grows a tensor: self-attention K/V live in
fixed per-slot buffers of n_text_ctx positions, cross-attention K/V are written once per window, and
one decode step feeds exactly one token per row at a per-row position. Nothing inside a step branches
in Python on a tensor value, so the step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from batchscribe.attention.base import AttentionBackend
from batchscribe.attention.sdpa import SdpaBackend
from batchscribe.model import cross_write, encoder_ops
from batchscribe.model.cache import DecoderCache
from batchscribe.model.dims import ModelDims


def _embedding(n: int, d: int) -> nn.Embedding:
    """nn.Embedding(n, d), except that a meta weight (built to take a checkpoint's) is not
    initialised: nn.Embedding's normal_ init of a meta tensor imports torch._dynamo, most of a
    second of start-up (docs/GPU_NOTES.md)."""
    weight = torch.empty(n, d)
    if weight.device.type != "meta":
        nn.init.normal_(weight)  # what nn.Embedding.reset_parameters does
    return nn.Embedding(n, d, _weight=weight)


def _add_norm(y: torch.Tensor, x: torch.Tensor, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream x + y and its next layer norm (y [B, d]: a sublayer's fresh output, which
    becomes the stream): encoder_ops.add_norm, one Triton pass on CUDA where eager makes two kernels;
    a step makes three a layer."""
    return y, encoder_ops.add_norm(y, x, None, norm, fp8=False)[0]


class Attention(nn.Module):
    """Projections of one multi-head attention block (HF names; k_proj has no bias)."""

    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.head_dim = n_state // n_head
        self.q_proj = nn.Linear(n_state, n_state)
        self.k_proj = nn.Linear(n_state, n_state, bias=False)
        self.v_proj = nn.Linear(n_state, n_state)
        self.out_proj = nn.Linear(n_state, n_state)
        # fuse_qkv's [3 * n_state, n_state] weight and bias; not in the state dict (derived).
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    def fuse_qkv(self) -> None:
        """q, k and v as one projection: a decode step's rows then make one GEMM where they made
        three small ones, each bound by its launch and ramp rather than its bytes. The separate
        projections become views of the fused weight, so no weight is held twice."""
        if self.qkv_weight is not None:
            return
        with torch.no_grad():
            weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # [3 * d, d]
            bias = torch.cat([self.q_proj.bias, torch.zeros_like(self.q_proj.bias), self.v_proj.bias])  # [3 * d]
        self.qkv_weight, self.qkv_bias = weight, bias
        d = weight.shape[1]
        for i, proj in enumerate((self.q_proj, self.k_proj, self.v_proj)):
            proj.weight = nn.Parameter(weight[i * d : (i + 1) * d], requires_grad=False)
        self.q_proj.bias = nn.Parameter(bias[:d], requires_grad=False)
        self.v_proj.bias = nn.Parameter(bias[2 * d :], requires_grad=False)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., n_state] -> q, k, v, each [..., n_head, head_dim] (views of one GEMM's output once fused)."""
        if self.qkv_weight is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).split(self.qkv_weight.shape[1], dim=-1)
        return self.heads(q), self.heads(k), self.heads(v)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n_state] -> [..., n_head, head_dim]"""
        return x.unflatten(-1, (self.n_head, self.head_dim))

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """Unmasked self-attention over a whole sequence (the encoder). x: [B, T, n_state]"""
        q, k, v = (self.heads(p(x)).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)  # [B, n_head, T, head_dim]
        return self.out_proj(out.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    def __init__(self, n_state: int, n_head: int, n_mlp: int):
        super().__init__()
        self.self_attn = Attention(n_state, n_head)
        self.self_attn_layer_norm = nn.LayerNorm(n_state)
        self.fc1 = nn.Linear(n_state, n_mlp)
        self.fc2 = nn.Linear(n_mlp, n_state)
        self.final_layer_norm = nn.LayerNorm(n_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.full(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, dims: ModelDims, n_mlp: int):
        super().__init__()
        d = dims.n_audio_state
        self.conv1 = nn.Conv1d(dims.n_mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = _embedding(dims.n_audio_ctx, d)
        self.layers = nn.ModuleList(
            EncoderLayer(d, dims.n_audio_head, n_mlp) for _ in range(dims.n_audio_layer)
        )
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [B, n_mels, 3000] -> [B, n_audio_ctx, n_audio_state]"""
        x = self.stem(mel)
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)

    def stem(self, mel: torch.Tensor) -> torch.Tensor:
        """The convolutions and positions: mel [B, n_mels, 3000] -> [B, n_audio_ctx, d], contiguous."""
        x = F.gelu(self.conv1(mel))
        # contiguous(): a transposed view here would make every later activation inherit the
        # [B, d, T] memory layout, and each layer then pays strided copies for its layer norms,
        # matmuls and residual adds (a large share of the encoder's time; docs/GPU_NOTES.md).
        x = F.gelu(self.conv2(x)).transpose(1, 2).contiguous()  # [B, 1500, d]
        return x + self.embed_positions.weight[: x.shape[1]]


class DecoderLayer(nn.Module):
    def __init__(self, n_state: int, n_head: int, n_mlp: int):
        super().__init__()
        self.self_attn = Attention(n_state, n_head)
        self.self_attn_layer_norm = nn.LayerNorm(n_state)
        self.encoder_attn = Attention(n_state, n_head)
        self.encoder_attn_layer_norm = nn.LayerNorm(n_state)
        self.fc1 = nn.Linear(n_state, n_mlp)
        self.fc2 = nn.Linear(n_mlp, n_state)
        self.final_layer_norm = nn.LayerNorm(n_state)


class TextDecoder(nn.Module):
    def __init__(self, dims: ModelDims, n_mlp: int):
        super().__init__()
        d = dims.n_text_state
        self.embed_tokens = _embedding(dims.n_vocab, d)
        self.embed_positions = _embedding(dims.n_text_ctx, d)
        self.layers = nn.ModuleList(
            DecoderLayer(d, dims.n_text_head, n_mlp) for _ in range(dims.n_text_layer)
        )
        self.layer_norm = nn.LayerNorm(d)
        # pad_logits' [n_vocab rounded up to 8, d] weight (embed_tokens' rows, then zeros); derived,
        # not in the state dict.
        self.register_buffer("logits_weight", None, persistent=False)

    def pad_logits(self) -> None:
        """The logits GEMM over a vocabulary padded to a multiple of 8 rows: multilingual Whisper's
        51,865 or 51,866 columns leave cuBLAS only its 2-aligned kernels, which ran the step's
        logits at ~3x the weight's read time (docs/GPU_NOTES.md). embed_tokens' weight becomes a
        view of the padded one, so nothing is held twice."""
        weight = self.embed_tokens.weight
        n_vocab, d = weight.shape
        if self.logits_weight is not None or n_vocab % 8 == 0:
            return
        with torch.no_grad():
            padded = torch.cat([weight, weight.new_zeros(-n_vocab % 8, d)])  # [n_vocab + pad, d]
        self.logits_weight = padded
        self.embed_tokens.weight = nn.Parameter(padded[:n_vocab], requires_grad=False)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, d] (after the final norm) -> [B, n_vocab] logits of the tied embedding (rows of a
        padded GEMM's output when padded: a strided view)."""
        if self.logits_weight is None:
            return h @ self.embed_tokens.weight.T
        return (h @ self.logits_weight.T)[:, : self.embed_tokens.weight.shape[0]]


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims, dims.n_audio_mlp)
        self.decoder = TextDecoder(dims, dims.n_text_mlp)

    @torch.no_grad()
    def write_cross_kv(
        self,
        cache: DecoderCache,
        enc: torch.Tensor,  # [B, n_audio_ctx, n_state]
        slots: torch.Tensor,  # [B] long, on enc's device
    ) -> None:
        """Project encoder output into each layer's cross K/V once per window."""
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.encoder_attn
            for cache_kv, proj in ((cache.cross_k[i], attn.k_proj), (cache.cross_v[i], attn.v_proj)):
                kv = attn.heads(proj(enc))  # [B, n_audio_ctx, n_head, head_dim]
                cross_write.store(cache_kv, kv, slots, cache.cross_hnd)

    @torch.no_grad()
    def decode_step(
        self,
        cache: DecoderCache,
        tokens: torch.Tensor,  # [B] long: the token at `positions` for each row
        positions: torch.Tensor,  # [B] long
        slots: torch.Tensor | None = None,  # [B] long; None: row i uses slot i
        kv_len: int | None = None,  # host-known bound on max(positions) + 1 (CPU speed-up)
        backend: AttentionBackend | None = None,
        upcast: bool = True,
    ) -> torch.Tensor:  # [B, n_vocab] logits for the token after `positions`: float32 if upcast, else the model's dtype
        backend = backend or SdpaBackend(cross_hnd=cache.cross_hnd)
        dec = self.decoder
        x = dec.embed_tokens(tokens) + dec.embed_positions(positions)  # [B, d]
        index = (torch.arange(tokens.shape[0], device=tokens.device) if slots is None else slots, positions)
        backend.begin_step(positions, slots)
        h = dec.layers[0].self_attn_layer_norm(x)  # each later norm comes with the residual add before it
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            q, k, v = attn.qkv(h)  # [B, n_head, head_dim] each
            # This step's K/V go into the cache at each row's position, then the token attends (itself included).
            out = backend.write_and_attend(q, k, v, cache.self_k[i], cache.self_v[i], index, slots, positions, kv_len)
            x, h = _add_norm(attn.out_proj(out.flatten(1)), x, layer.encoder_attn_layer_norm)

            cross = layer.encoder_attn
            q = cross.heads(cross.q_proj(h))
            out = backend.cross_attention(q, cache.cross_k[i], cache.cross_v[i], slots)
            x, h = _add_norm(cross.out_proj(out.flatten(1)), x, layer.final_layer_norm)

            after = dec.layers[i + 1].self_attn_layer_norm if i + 1 < len(dec.layers) else dec.layer_norm
            x, h = _add_norm(layer.fc2(F.gelu(layer.fc1(h))), x, after)
        logits = dec.logits(h)  # [B, n_vocab]
        return logits.float() if upcast else logits

    def fuse_decoder_qkv(self) -> None:
        """Each decoder layer's self-attention q/k/v as one projection (Attention.fuse_qkv): after
        the weights are loaded and placed, before any decode step is captured."""
        for layer in self.decoder.layers:
            layer.self_attn.fuse_qkv()

    def prepare_decoder(self) -> None:
        """The decode step's fused forms: q/k/v as one projection and the logits over a padded
        vocabulary. Idempotent (an engine per decoding option shares one model); after the weights
        are loaded and placed (a later `.to()` would copy the views apart), before any capture."""
        self.fuse_decoder_qkv()
        self.decoder.pad_logits()

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Load a transformers WhisperForConditionalGeneration state dict; every key must match.
        assign: take the tensors as the parameters (a model built on the meta device) instead of
        copying into them."""
        ours = {}
        for name, tensor in state.items():
            if name == "proj_out.weight":
                continue  # tied to decoder.embed_tokens in every Whisper checkpoint
            ours[name.removeprefix("model.")] = tensor
        missing, unexpected = self.load_state_dict(ours, strict=False, assign=assign)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match the Whisper architecture: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}; is it a Whisper checkpoint in Hugging Face format?"
            )

