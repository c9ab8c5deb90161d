"""A greedy step's logit rules, token choice and no-speech probability as one Triton kernel.

`logits.LogitRules.apply` + `logits.select_tokens` (greedy) + the softmax the no-speech probability
is read from are a dozen full-vocabulary passes over a [B, 51864] float32 tensor and ~40 small
kernels per step, a large share of a small model's step time on the GPU (docs/GPU_NOTES.md).
Every rule only masks columns under per-row conditions, and all the choice needs from the masked
row is a few reductions, so one program per row reads the logits once, in their own dtype:

- the raw row's log-sum-exp, for the no-speech probability (openai reads it from the unmasked
  softmax at <|startoftranscript|>);
- over the masked text columns [0, timestamp_begin) and timestamp columns [timestamp_begin, V)
  separately: the maximum, its first index and the log-sum-exp.

openai's "timestamps outweigh every text token" test (logsumexp of the timestamp log-probs > the
best text log-prob) compares the same two quantities less the same normaliser, so it is
`lse_timestamps > max_text` here. Masks are the rules in `logits.py`, term for term; the token sets
(SuppressTokens, SuppressBlank, and <|notimestamps|> while timestamps are on) arrive as a per-column
bit field built once. Sampled steps (temperature fallback) keep the tensor path.

Nothing here syncs with the host or allocates outside the caller's stream, so it runs inside the
decoder's CUDA graphs; the graph runner's eager warm-up step compiles it before any capture (one
compilation per model: the vocabulary split is a compile-time constant, the row count is the grid).
"""

from __future__ import annotations

import torch

from batchscribe.engine.logits import RuleSpec

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the tensor path runs instead
    triton = None

_SUPPRESS, _BLANK = 1, 2  # bits of the per-column flags
BLOCK = 2048  # columns per loop iteration


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _scan(
        Row, Flags,
        at_begin, pair_done, pair_open, floor, tb, eot, initial_limit,
        raw_m, raw_s,
        LO: tl.constexpr, HI: tl.constexpr, TIMESTAMPS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """Columns [LO, HI): the masked maximum, its first index and sum of exp (relative to the
        maximum), and the raw running log-sum-exp state carried in and out. The bounds are
        compile-time constants (one model's vocabulary), so the loops have fixed trip counts."""
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([], tl.float32)
        arg = tl.zeros([], tl.int32)
        for start in range(LO, HI, BLOCK):
            v = start + tl.arange(0, BLOCK)
            inside = v < HI
            x = tl.load(Row + v, mask=inside, other=float("-inf")).to(tl.float32)  # [BLOCK]
            # The raw row, for the no-speech softmax.
            bm = tl.maximum(raw_m, tl.max(x, 0))
            safe = tl.where(bm == float("-inf"), 0.0, bm)
            raw_s = raw_s * tl.exp(raw_m - safe) + tl.sum(tl.exp(x - safe), 0)
            raw_m = bm
            flags = tl.load(Flags + v, mask=inside, other=0)
            dead = ((flags & 1) != 0) | (((flags & 2) != 0) & at_begin)  # columns past HI load as -inf
            if TIMESTAMPS:
                stamp = v >= tb
                dead = dead | (stamp & pair_done)  # a pair is complete: text or end-of-text next
                dead = dead | ((v < eot) & pair_open)  # a pair is open: a timestamp or end-of-text
                dead = dead | (stamp & (v < floor))  # timestamps never decrease
                dead = dead | ((~stamp) & at_begin)  # the first token is a timestamp ...
                dead = dead | ((v >= initial_limit) & at_begin)  # ... no later than the limit
            y = tl.where(dead, float("-inf"), x)
            block_max = tl.max(y, 0)
            block_arg = tl.argmax(y, 0).to(tl.int32)  # the first of equal maxima
            arg = tl.where(block_max > m, start + block_arg, arg)  # strictly greater: first wins
            new_m = tl.maximum(m, block_max)
            safe = tl.where(new_m == float("-inf"), 0.0, new_m)
            s = s * tl.exp(m - safe) + tl.sum(tl.exp(y - safe), 0)
            m = new_m
        return m, arg, s, raw_m, raw_s

    @triton.jit
    def _greedy_select(
        Logits, Flags, Tokens, NextPos, Begin, LastTs,
        Chosen, Logprob, NoSpeech,
        stride_l, stride_t, n_ctx, eot, initial_limit, no_speech,
        TB: tl.constexpr, N_VOCAB: tl.constexpr, TIMESTAMPS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        next_pos = tl.load(NextPos + row)
        n_sampled = next_pos - tl.load(Begin + row)
        at_begin = n_sampled == 0
        never = n_sampled != n_sampled
        tb = TB
        pair_done, pair_open, floor = never, never, tb
        if TIMESTAMPS:
            tokens = Tokens + row.to(tl.int64) * stride_t
            last = tl.load(tokens + tl.minimum(tl.maximum(next_pos - 1, 0), n_ctx - 1))
            penult = tl.load(tokens + tl.minimum(tl.maximum(next_pos - 2, 0), n_ctx - 1))
            last_was_ts = (n_sampled >= 1) & (last >= tb)
            penult_was_ts = (n_sampled < 2) | (penult >= tb)
            pair_done = last_was_ts & penult_was_ts
            pair_open = last_was_ts & (~penult_was_ts)
            last_ts = tl.load(LastTs + row)
            floor = tl.where(last_ts >= 0, tl.where(pair_open, last_ts, last_ts + 1), tb)
        logits = Logits + row.to(tl.int64) * stride_l
        raw_m = tl.full([], float("-inf"), tl.float32)
        raw_s = tl.zeros([], tl.float32)
        t_m, t_arg, t_s, raw_m, raw_s = _scan(
            logits, Flags, at_begin, pair_done, pair_open, floor, tb, eot, initial_limit, raw_m, raw_s,
            0, TB, TIMESTAMPS, BLOCK,
        )  # fmt: skip
        s_m, s_arg, s_s, raw_m, raw_s = _scan(
            logits, Flags, at_begin, pair_done, pair_open, floor, tb, eot, initial_limit, raw_m, raw_s,
            TB, N_VOCAB, TIMESTAMPS, BLOCK,
        )  # fmt: skip
        lse_t = t_m + tl.log(t_s)  # -inf when every text column is masked
        lse_s = s_m + tl.log(s_s)
        raw_lse = raw_m + tl.log(raw_s)
        # Timestamps win: the text columns are masked, and the choice is among timestamps. Without
        # timestamps the host passes tb = V: no timestamp columns, lse_s = -inf, never wins.
        ts_wins = lse_s > t_m
        hi = tl.maximum(lse_t, lse_s)
        safe = tl.where(hi == float("-inf"), 0.0, hi)
        lse_all = safe + tl.log(tl.exp(lse_t - safe) + tl.exp(lse_s - safe))
        take_stamp = ts_wins | (s_m > t_m)  # text first among equal maxima, as argmax does
        chosen = tl.where(take_stamp, s_arg, t_arg)
        best = tl.where(take_stamp, s_m, t_m)
        logprob = best - tl.where(ts_wins, lse_s, lse_all)
        tl.store(Chosen + row, chosen.to(tl.int64))
        tl.store(Logprob + row, logprob)
        x_ns = tl.load(logits + no_speech).to(tl.float32)
        tl.store(NoSpeech + row, tl.exp(x_ns - raw_lse))


class GreedySelect:
    """The rules of `spec` plus greedy choice, for rows of logits on a CUDA device (or, under
    TRITON_INTERPRET=1, the CPU: the tests)."""

    def __init__(self, spec: RuleSpec, no_speech: int, device: torch.device | str):
        if triton is None:
            raise RuntimeError("the fused greedy step needs the triton package (it ships with CUDA torch)")
        self.spec, self.no_speech = spec, no_speech
        flags = torch.zeros(spec.n_vocab, dtype=torch.int8)
        flags[list(spec.suppress)] |= _SUPPRESS
        if spec.timestamps:
            flags[spec.no_timestamps] |= _SUPPRESS  # ApplyTimestampRules always masks it
        flags[list(spec.blank)] |= _BLANK
        self.flags = flags.to(device)  # [V] int8
        # Without timestamps the split at timestamp_begin only partitions the reductions.
        self.tb = spec.timestamp_begin if spec.timestamps else spec.n_vocab

    def __call__(
        self,
        logits: torch.Tensor,  # [B, V] float32/float16/bfloat16, contiguous rows
        tokens: torch.Tensor,  # [B, n_ctx] long, the rows' token buffers
        next_pos: torch.Tensor,  # [B] long
        sample_begin: torch.Tensor,  # [B] long
        last_timestamp: torch.Tensor,  # [B] long, -1 if none
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # chosen [B] long, logprob [B], p_no_speech [B]
        n_rows, n_vocab = logits.shape
        if logits.stride(1) != 1 or tokens.stride(1) != 1:
            raise ValueError("logits and tokens need contiguous rows")
        chosen = torch.empty(n_rows, dtype=torch.long, device=logits.device)
        logprob = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        no_speech = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        spec = self.spec
        _greedy_select[(n_rows,)](
            logits, self.flags, tokens, next_pos, sample_begin, last_timestamp,
            chosen, logprob, no_speech,
            logits.stride(0), tokens.stride(0), tokens.shape[1], spec.eot, spec.initial_limit, self.no_speech,
            TB=self.tb, N_VOCAB=n_vocab, TIMESTAMPS=spec.timestamps, BLOCK=BLOCK, num_warps=8,
        )  # fmt: skip
        return chosen, logprob, no_speech
