"""openai/whisper's logit rules as tensor operations over per-row state.

The rules and their order are openai/whisper `decoding.py`'s (SuppressBlank, SuppressTokens,
ApplyTimestampRules) and transformers' (SuppressTokensAtBegin, SuppressTokens,
WhisperTimeStampLogitsProcessor). Where those loop over rows in Python and read token lists on the
host, this module reads the same facts from tensors (the row's token buffer, where its sampling began,
the last timestamp it sampled), so a whole step can run inside a CUDA graph with no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class RuleSpec:
    """Token ids the rules need, all read from the tokenizer by the caller."""

    n_vocab: int
    eot: int
    no_timestamps: int
    timestamp_begin: int
    suppress: tuple[int, ...]  # always suppressed (SuppressTokens)
    blank: tuple[int, ...]  # suppressed at the first sampled position (SuppressBlank)
    timestamps: bool  # ApplyTimestampRules on (off in without-timestamps mode)
    max_initial_timestamp_index: int | None  # 50 for 1.0 s; None: unbounded

    @property
    def initial_limit(self) -> int:
        """At the first sampled position only tokens below this (timestamps up to the max initial
        one) are allowed."""
        if self.max_initial_timestamp_index is None:
            return self.n_vocab
        return min(self.n_vocab, self.timestamp_begin + self.max_initial_timestamp_index + 1)


class LogitRules:
    """Builds the rule's token sets once on a device and applies them to a batch of rows.

    Every rule writes -inf into a fixed range or list of columns under a per-row condition, so it is
    applied to that slice of the logits with a [B, 1] condition instead of building [B, n_vocab]
    masks and filling whole rows with them (a large share of a small model's step on the GPU).
    """

    def __init__(self, spec: RuleSpec, device: torch.device | str):
        self.spec = spec
        ids = dict(dtype=torch.long, device=device)
        self.suppress_ids = torch.tensor(sorted(set(spec.suppress)), **ids)  # [n_suppress]
        self.blank_ids = torch.tensor(sorted(set(spec.blank)), **ids)  # [n_blank]
        self.timestamp_ids = torch.arange(spec.timestamp_begin, spec.n_vocab, **ids)  # [n_timestamps]

    def apply(
        self,
        logits: torch.Tensor,  # [B, V] float32, modified and returned
        tokens: torch.Tensor,  # [B, n_text_ctx] long: each row's prompt and sampled tokens
        next_pos: torch.Tensor,  # [B] long: position of the token being chosen
        sample_begin: torch.Tensor,  # [B] long: position of the first sampled token
        last_timestamp: torch.Tensor,  # [B] long: last sampled timestamp token, -1 if none
    ) -> torch.Tensor:
        n_sampled = next_pos - sample_begin  # [B] tokens sampled so far
        at_begin = (n_sampled == 0)[:, None]  # [B, 1]
        if self.blank_ids.numel():  # SuppressBlank
            blank = logits.index_select(1, self.blank_ids).masked_fill_(at_begin, NEG_INF)
            logits.index_copy_(1, self.blank_ids, blank)
        if self.suppress_ids.numel():  # SuppressTokens
            logits.index_fill_(1, self.suppress_ids, NEG_INF)
        if self.spec.timestamps:
            self._timestamp_rules(logits, tokens, next_pos, n_sampled, at_begin, last_timestamp)
        return logits

    def _timestamp_rules(self, logits, tokens, next_pos, n_sampled, at_begin, last_timestamp) -> None:
        spec = self.spec
        tb = spec.timestamp_begin
        text, stamps = logits[:, :tb], logits[:, tb:]  # views: [B, tb] and [B, V - tb]
        logits[:, spec.no_timestamps] = NEG_INF
        ctx = tokens.shape[1]
        last = tokens.gather(1, (next_pos - 1).clamp(0, ctx - 1)[:, None]).squeeze(1)
        penult = tokens.gather(1, (next_pos - 2).clamp(0, ctx - 1)[:, None]).squeeze(1)
        last_was_ts = (n_sampled >= 1) & (last >= tb)  # [B]
        penult_was_ts = (n_sampled < 2) | (penult >= tb)  # [B]

        # Timestamps come in pairs, except directly before end-of-text.
        pair_done = (last_was_ts & penult_was_ts)[:, None]  # [B, 1]
        pair_open = (last_was_ts & ~penult_was_ts)[:, None]
        stamps.masked_fill_(pair_done, NEG_INF)
        logits[:, : spec.eot].masked_fill_(pair_open, NEG_INF)

        # Timestamps never decrease, and a closed segment must have non-zero length.
        has_ts = last_timestamp >= 0
        floor = torch.where(pair_open.squeeze(1), last_timestamp, last_timestamp + 1)
        floor = torch.where(has_ts, floor, torch.full_like(floor, tb))
        stamps.masked_fill_(self.timestamp_ids[None, :] < floor[:, None], NEG_INF)  # [B, V - tb] mask

        # The first sampled token is a timestamp no later than max_initial_timestamp.
        text.masked_fill_(at_begin, NEG_INF)
        logits[:, spec.initial_limit :].masked_fill_(at_begin, NEG_INF)

        # If timestamps together outweigh every single text token, sample a timestamp (openai
        # reduces the same slices of the log-probabilities).
        logprobs = torch.log_softmax(logits, dim=-1)
        ts_mass = logprobs[:, tb:].logsumexp(dim=-1)  # [B]
        best_text = logprobs[:, :tb].amax(dim=-1)  # [B]
        text.masked_fill_((ts_mass > best_text)[:, None], NEG_INF)


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch holds it."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniform_noise(keys: torch.Tensor, positions: torch.Tensor, n_vocab: int) -> torch.Tensor:
    """[B, V] uniforms in (0, 1) from a counter-based hash (splitmix64) of (row key, position, token).

    A row's draws depend only on its own key and position, never on which slot it sits in or what
    else is decoding, so a sampled (fallback) window decodes the same in any batch and after a
    resume. Integer ops only: identical on every device and capturable in a CUDA graph.
    """
    vocab = torch.arange(n_vocab, device=keys.device)
    x = keys[:, None] * _GOLDEN + positions[:, None] * _MIX2 + vocab[None, :]  # int64, wraps
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    top53 = _shr(x, 11).to(torch.float64)
    return ((top53 + 0.5) / float(1 << 53)).to(torch.float32).clamp_(1e-12, 1 - 1e-7)


def select_tokens(
    logits: torch.Tensor,  # [B, V] float32 after the rules
    temperature: torch.Tensor,  # [B] float32; 0 is greedy
    noise_keys: torch.Tensor | None,  # [B] long: each row's sampling key (see uniform_noise)
    positions: torch.Tensor | None,  # [B] long: the position being sampled
    sample: bool,  # host-known: does any row have temperature > 0?
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B] long, their log-probabilities [B]
    """Greedy or temperature sampling per row; the logprob is of the untempered distribution,
    as openai GreedyDecoder.update computes it."""
    chosen = logits.argmax(dim=-1)
    if sample:
        # Gumbel-max draws from softmax(logits / T) without a data-dependent multinomial.
        u = uniform_noise(noise_keys, positions, logits.shape[1])
        gumbel = -torch.log(-torch.log(u))
        scaled = logits / temperature.clamp(min=1e-6)[:, None] + gumbel
        chosen = torch.where(temperature > 0, scaled.argmax(dim=-1), chosen)
    logprobs = torch.log_softmax(logits, dim=-1)
    return chosen, logprobs.gather(1, chosen[:, None]).squeeze(1)
