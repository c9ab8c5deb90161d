"""Our tensor logit rules against openai/whisper's own rule classes and transformers' processors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from batchscribe.engine.logits import LogitRules, RuleSpec, select_tokens

whisper_decoding = pytest.importorskip("whisper.decoding")

# A small made-up vocabulary laid out like Whisper's: text, eot, specials, then timestamps.
V, EOT, NO_TS, TS0 = 200, 120, 139, 140
SUPPRESS = (3, 7, 121, 122)
BLANK = (5, EOT)


def _spec(timestamps: bool = True, max_initial: int | None = 5) -> RuleSpec:
    return RuleSpec(V, EOT, NO_TS, TS0, SUPPRESS, BLANK, timestamps, max_initial)


def _openai_rules(sample_begin: int, max_initial: int | None):
    tok = SimpleNamespace(eot=EOT, no_timestamps=NO_TS, timestamp_begin=TS0, encode=lambda s: [5])
    return [
        whisper_decoding.SuppressBlank(tok, sample_begin),
        whisper_decoding.SuppressTokens(list(SUPPRESS)),
        whisper_decoding.ApplyTimestampRules(tok, sample_begin, max_initial),
    ]


def _random_history(gen: torch.Generator, rows: int, sample_begin: int, length: int) -> torch.Tensor:
    """Token rows mixing text and timestamps, with increasing timestamps (as decoding produces)."""
    out = torch.zeros(rows, length, dtype=torch.long)
    for r in range(rows):
        ts = TS0
        for t in range(sample_begin, length):
            if torch.rand(1, generator=gen).item() < 0.4:
                ts = min(V - 1, ts + int(torch.randint(0, 4, (1,), generator=gen)))
                out[r, t] = ts
            else:
                out[r, t] = int(torch.randint(0, EOT, (1,), generator=gen))
    return out


def _last_timestamp(tokens: torch.Tensor, sample_begin: int) -> torch.Tensor:
    last = torch.full((tokens.shape[0],), -1, dtype=torch.long)
    for r, row in enumerate(tokens[:, sample_begin:].tolist()):
        ts = [t for t in row if t >= TS0]
        last[r] = ts[-1] if ts else -1
    return last


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n_sampled", [0, 1, 2, 5])
def test_rules_equal_openai(seed: int, n_sampled: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rows, sample_begin = 8, 3
    history = _random_history(gen, rows, sample_begin, sample_begin + n_sampled)
    # Sharp random logits so the timestamp-mass rule goes both ways across rows.
    logits = torch.randn(rows, V, generator=gen) * 4
    logits[: rows // 2, TS0:] += 3.0

    expected = logits.clone()
    for rule in _openai_rules(sample_begin, 5):
        rule.apply(expected, history)

    buffer = torch.zeros(rows, 32, dtype=torch.long)
    buffer[:, : history.shape[1]] = history
    ours = LogitRules(_spec(), "cpu").apply(
        logits.clone(),
        buffer,
        torch.full((rows,), history.shape[1]),
        torch.full((rows,), sample_begin),
        _last_timestamp(history, sample_begin),
    )
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = ~torch.isinf(expected)
    assert torch.equal(ours[finite], expected[finite])


def test_rules_equal_transformers_processors() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )

    gen = torch.Generator().manual_seed(1)
    rows, begin = 6, 2
    config = transformers.GenerationConfig(
        no_timestamps_token_id=NO_TS, eos_token_id=EOT, max_initial_timestamp_index=5
    )
    processors = [
        SuppressTokensAtBeginLogitsProcessor(list(BLANK), begin_index=begin),
        SuppressTokensLogitsProcessor(list(SUPPRESS)),
        WhisperTimeStampLogitsProcessor(config, begin_index=begin),
    ]
    rules = LogitRules(_spec(), "cpu")
    for n_sampled in range(6):
        history = _random_history(gen, rows, begin, begin + n_sampled)
        logits = torch.randn(rows, V, generator=gen) * 4
        expected = logits.clone()
        for proc in processors:
            expected = proc(history, expected)
        buffer = torch.zeros(rows, 16, dtype=torch.long)
        buffer[:, : history.shape[1]] = history
        ours = rules.apply(
            logits.clone(),
            buffer,
            torch.full((rows,), history.shape[1]),
            torch.full((rows,), begin),
            _last_timestamp(history, begin),
        )
        assert torch.equal(torch.isinf(ours), torch.isinf(expected)), n_sampled


def test_rows_at_different_positions_are_independent() -> None:
    """One batched call with ragged positions equals one call per row."""
    gen = torch.Generator().manual_seed(5)
    rules = LogitRules(_spec(), "cpu")
    buffer = _random_history(gen, 4, 2, 20)
    next_pos = torch.tensor([2, 3, 9, 15])
    begin = torch.full((4,), 2)
    last_ts = torch.stack([_last_timestamp(buffer[r : r + 1, : int(p)], 2)[0] for r, p in enumerate(next_pos)])
    logits = torch.randn(4, V, generator=gen) * 3
    batched = rules.apply(logits.clone(), buffer, next_pos, begin, last_ts)
    for r in range(4):
        single = rules.apply(logits[r : r + 1].clone(), buffer[r : r + 1], next_pos[r : r + 1], begin[:1], last_ts[r : r + 1])
        assert torch.equal(batched[r : r + 1], single)


def test_without_timestamps_only_suppresses() -> None:
    rules = LogitRules(_spec(timestamps=False), "cpu")
    logits = torch.zeros(2, V)
    out = rules.apply(logits, torch.zeros(2, 8, dtype=torch.long), torch.tensor([1, 4]), torch.tensor([1, 1]), torch.tensor([-1, -1]))
    assert torch.isinf(out[0, list(BLANK) + list(SUPPRESS)]).all()
    assert torch.isinf(out[1, list(SUPPRESS)]).all() and not torch.isinf(out[1, 5])
    assert not torch.isinf(out[:, TS0:]).any()


def test_select_greedy_and_sampling() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 1.0, 0.0]])
    tokens, logprobs = select_tokens(logits, torch.zeros(2), None, None, sample=False)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1))
    # Sampling at temperature 1 follows softmax(logits): check the frequencies.
    many = logits[1:].repeat(20000, 1)
    keys = torch.arange(20000) * 7919 + 13
    drawn, _ = select_tokens(many, torch.ones(20000), keys, torch.full((20000,), 5), sample=True)
    freq = torch.bincount(drawn, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.softmax(logits[1], -1), atol=0.015)
    # Temperature sharpens: at T=0.25 the top token wins far more often than softmax says.
    sharp, _ = select_tokens(many, torch.full((20000,), 0.25), keys, torch.full((20000,), 5), sample=True)
    assert (sharp == 0).float().mean() > 0.9


def test_sampling_noise_is_per_row_and_uniform() -> None:
    """A row's draws depend on its key and position only: not on its row index or batch."""
    from batchscribe.engine.logits import uniform_noise

    keys, pos = torch.tensor([11, 22, 33]), torch.tensor([4, 9, 4])
    batch = uniform_noise(keys, pos, 1000)
    assert torch.equal(uniform_noise(keys.flip(0), pos.flip(0), 1000), batch.flip(0))
    assert torch.equal(uniform_noise(keys[1:2], pos[1:2], 1000), batch[1:2])
    assert not torch.equal(uniform_noise(keys, pos + 1, 1000), batch)
    flat = uniform_noise(torch.arange(200), torch.zeros(200, dtype=torch.long), 1000).flatten()
    assert 0 < flat.min() and flat.max() < 1
    # Uniform: each decile holds ~10 % of 200,000 draws; mean 0.5.
    counts = torch.histc(flat, bins=10, min=0, max=1) / flat.numel()
    assert torch.allclose(counts, torch.full((10,), 0.1), atol=0.005)
    assert abs(flat.mean().item() - 0.5) < 0.005
