"""Prefill: an initial prompt's self-attention K/V written into the slots in one decoder pass.

A window decoded with an initial prompt (`--initial-prompt`) starts `<|startofprev|> prompt...
<|startoftranscript|> ...` as openai's DecodingTask builds it. Feeding the up to 224 prompt tokens
one per decode step would cost as many steps as the transcript itself; instead, right after
admission encodes the group, one causal pass over the group's padded prompt rows computes every
layer's K/V at positions [0, sot) and writes them into the slots' self-attention cache, and the
slots start stepping at <|startoftranscript|>. Rows shorter than the longest prompt write K/V past
their own sot too; those positions are written again by the step that feeds them before any query
reads them (the self-attention mask stops at the row's position), so they never count.

A batch-invariant engine gives every prefill one shape, since the pass's GEMM kernels change with
it (`prefill_groups`); with CUDA graphs that one shape is captured (`prefill_packed`, the engine's
PassGraphs): eagerly each prefill is a few hundred launches, each waiting for the GIL.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from batchscribe.model.cache import DecoderCache
from batchscribe.model.whisper import Whisper

# Not cuDNN's attention: it builds an execution graph on the host for every new shape, and this pass
# runs eagerly at a new group size at almost every admission (docs/GPU_NOTES.md, fourteenth session).
EAGER_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
INVARIANT_GROUP = 8  # a batch-invariant engine's prompts per prefill on CUDA


def prefill_groups(rows: Sequence[int], sots: Sequence[int], n_ctx: int, cuda: bool,
                   invariant: bool) -> list[tuple[list[int], int]]:  # fmt: skip
    """The prefills of an admission's prompted `rows` (with their `sots`): (rows, padded length)
    each. By default one, padded to the longest prompt. Batch-invariant: on CUDA groups of
    INVARIANT_GROUP rows, the last filled with copies of its last row (its slot written again with
    the same K/V), each n_ctx // 2 tokens long, the longest a prompt can be (openai keeps
    n_ctx // 2 - 1 tokens after <|startofprev|>): one shape for every prefill. On the CPU each row
    alone at its own length (padding would cost more there than it saves)."""
    if not rows:
        return []
    if not invariant:
        return [(list(rows), max(sots))]
    if not cuda:
        return [([row], sot) for row, sot in zip(rows, sots)]
    length = max(n_ctx // 2, *sots)
    groups = [list(rows[s : s + INVARIANT_GROUP]) for s in range(0, len(rows), INVARIANT_GROUP)]
    return [(group + group[-1:] * (INVARIANT_GROUP - len(group)), length) for group in groups]


@torch.no_grad()
def prefill_prompts(
    model: Whisper,
    cache: DecoderCache,
    tokens: torch.Tensor,  # [G, P] long: each row's tokens from position 0, padded to P (its longest sot)
    slots: torch.Tensor,  # [G] long: where the rows' K/V go (cross K/V already written there)
) -> None:
    """Write self-attention K/V for positions [0, P) of each row into `slots` of `cache`."""
    with sdpa_kernel(EAGER_BACKENDS):
        _prefill(model, cache, tokens, slots)


def prefill_packed(model: Whisper, cache: DecoderCache, packed: torch.Tensor, _size: object = None) -> None:
    """`prefill_prompts` over one packed input, [G, 1 + P] long: each row's slot, then its tokens
    (one static input for a graph; graphs.PassGraphs's `forward`)."""
    prefill_prompts(model, cache, packed[:, 1:], packed[:, 0])


def _prefill(model: Whisper, cache: DecoderCache, tokens: torch.Tensor, slots: torch.Tensor) -> None:
    dec = model.decoder
    length = tokens.shape[1]
    positions = torch.arange(length, device=tokens.device)
    x = dec.embed_tokens(tokens) + dec.embed_positions(positions)  # [G, P, d]
    where = (slots[:, None], positions[None, :])  # index [G, P] into [n_slots, n_text_ctx]
    for i, layer in enumerate(dec.layers):
        attn = layer.self_attn
        q, k, v = attn.qkv(layer.self_attn_layer_norm(x))  # [G, P, H, D] each: the step's projection
        cache.self_k[i].index_put_(where, k.to(cache.self_k[i].dtype))
        cache.self_v[i].index_put_(where, v.to(cache.self_v[i].dtype))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + attn.out_proj(out.transpose(1, 2).flatten(2))
        if i == len(dec.layers) - 1:
            break  # the last layer's K/V are written; what follows feeds no cache
        cross = layer.encoder_attn
        q = cross.heads(cross.q_proj(layer.encoder_attn_layer_norm(x))).transpose(1, 2)  # [G, H, P, D]
        ck, cv = cache.cross_rows(i, slots, q.dtype)
        x = x + cross.out_proj(F.scaled_dot_product_attention(q, ck, cv).transpose(1, 2).flatten(2))
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
