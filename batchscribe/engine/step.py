"""The decode step: one token per row for rows [0, n), as tensor operations over the slot state.

Each row is fed the token at its position; forced prompt tokens, language detection, the OpenAI
logit rules, sampling, log-prob sums and end-of-text flags are all tensor operations with no host
sync and no Python branching on tensor values, so the same step runs eagerly on the CPU and, on
CUDA, inside a graph (graphs.StepGraphs captures `Look`). Rows that are free or finished are inert.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from batchscribe.attention.base import AttentionBackend
from batchscribe.engine import triton_select
from batchscribe.engine.logits import LogitRules, RuleSpec, select_tokens
from batchscribe.engine.requests import LANGUAGE_POSITION
from batchscribe.engine.slots import SlotTensors
from batchscribe.model.cache import DecoderCache
from batchscribe.model.whisper import Whisper


@dataclass(frozen=True)
class StepSpec:
    """Static facts the step needs; built once from the tokenizer and the decoding options."""

    rules: RuleSpec
    no_speech: int
    language_tokens: tuple[int, ...]  # candidates for language detection
    sample_len: int


class StepRules:
    """The logit rules on one device, built once: the tensor rules, the fused greedy kernel where
    it is used (CUDA with triton), and the language-token ids."""

    def __init__(self, spec: StepSpec, device: torch.device, fused_greedy: bool):
        self.spec = spec
        self.tensor_rules = LogitRules(spec.rules, device)
        self.greedy = triton_select.GreedySelect(spec.rules, spec.no_speech, device) if fused_greedy else None
        self.language_ids = torch.tensor(spec.language_tokens or [0], device=device)  # [L]


@torch.no_grad()
def decode_step(
    slots: SlotTensors,
    model: Whisper,
    cache: DecoderCache,
    backend: AttentionBackend,
    rules: StepRules,
    n: int,  # rows [0, n) step (row i is slot i)
    kv_len: int | None,  # self-attention length bound; None: n_text_ctx
    sample: bool,  # host-known: does any row decode at a temperature above 0?
) -> None:
    """One step for rows [0, n): reads and writes only `slots` and `cache` (persistent tensors)."""
    rows, spec = slice(0, n), rules.spec
    n_ctx = slots.tokens.shape[1]
    tokens, positions, running = slots.tokens[rows], slots.positions[rows], slots.running[rows]
    fed = tokens.gather(1, positions[:, None]).squeeze(1)  # [n]
    greedy = rules.greedy is not None and not sample
    # [n, V]: float32 for the tensor path; the fused kernel reads the model's dtype as it is.
    logits = model.decode_step(cache, fed, positions, None, kv_len, backend, upcast=not greedy)
    next_pos, begin = positions + 1, slots.sample_begin[rows]
    # Language detection: the raw distribution restricted to language tokens (read before the
    # tensor path's rules write into the logits).
    language = rules.language_ids[logits[:, rules.language_ids].argmax(dim=-1)]  # [n]
    if greedy:
        sampled, logprob, p_no_speech = rules.greedy(logits, tokens, next_pos, begin, slots.last_timestamp[rows])
    else:
        p_no_speech = torch.softmax(logits, dim=-1)[:, spec.no_speech]
        filtered = rules.tensor_rules.apply(logits, tokens, next_pos, begin, slots.last_timestamp[rows])
        sampled, logprob = select_tokens(filtered, slots.temperature[rows], slots.noise_key[rows], next_pos, sample)
    # no_speech_prob is read where <|startoftranscript|> is fed (openai DecodingTask's sot_index).
    sot = slots.sot_pos[rows]
    at_sot = running & (positions == sot)
    slots.no_speech_prob[rows] = torch.where(at_sot, p_no_speech, slots.no_speech_prob[rows])

    forced = next_pos < begin
    prompt_tok = tokens.gather(1, next_pos.clamp(max=n_ctx - 1)[:, None]).squeeze(1)
    detecting = forced & slots.detect[rows] & (next_pos == sot + LANGUAGE_POSITION)
    new_tok = torch.where(detecting, language, torch.where(forced, prompt_tok, sampled))

    generating = running & ~forced
    slots.sum_logprob[rows] += torch.where(generating, logprob, torch.zeros_like(logprob))
    write_pos = torch.where(running, next_pos, positions).clamp(max=n_ctx - 1)
    old = tokens.gather(1, write_pos[:, None]).squeeze(1)
    tokens.scatter_(1, write_pos[:, None], torch.where(running, new_tok, old)[:, None])
    is_ts = new_tok >= spec.rules.timestamp_begin
    slots.last_timestamp[rows] = torch.where(generating & is_ts, new_tok, slots.last_timestamp[rows])
    eot = generating & (new_tok == spec.rules.eot)
    slots.hit_eot[rows] |= eot
    done = eot | (generating & (next_pos >= slots.sample_end[rows]))
    slots.positions[rows] = torch.where(running, next_pos, positions).clamp(max=n_ctx - 1)
    slots.running[rows] = running & ~done


@dataclass(frozen=True)
class Look:
    """What the host launches between two looks at the slots: `steps` decode steps, then the pack
    of the snapshot table. Holds the step's inputs, not the engine, so the graphs that capture it
    reference no object that references them."""

    slots: SlotTensors
    model: Whisper
    cache: DecoderCache
    backend: AttentionBackend
    rules: StepRules
    pack: Callable[[int], None]  # packs rows [0, n) of the snapshot table (snapshots.SnapshotQueue.pack)
    steps: int

    def prepare(self, n_rows: int) -> None:
        """The attention backend's host work for n_rows rows; before any capture of them."""
        self.backend.prepare(n_rows)

    def step(self, n_rows: int, kv_len: int | None, sample: bool) -> None:
        decode_step(self.slots, self.model, self.cache, self.backend, self.rules, n_rows, kv_len, sample)

    def __call__(self, n_rows: int, kv_len: int | None, sample: bool) -> None:
        for _ in range(self.steps):
            self.step(n_rows, kv_len, sample)
        self.pack(n_rows)
