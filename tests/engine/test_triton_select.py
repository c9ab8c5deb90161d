"""The fused greedy step (engine/triton_select) against the tensor rules (engine/logits, which the
transformers parity tests check) and torch's softmax: the same token, log-probability and no-speech
probability for every row state the rules distinguish. On the CPU through Triton's interpreter; on
a GPU compiled, at tiny.en's real vocabulary, and inside the engine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

# Runs in its own interpreter: TRITON_INTERPRET must be set before triton decorates the kernels.
CHECK = textwrap.dedent(
    """
    import sys, torch
    from batchscribe.engine.logits import LogitRules, RuleSpec, select_tokens
    from batchscribe.engine.triton_select import GreedySelect
    device, n_vocab = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    tb, eot = n_vocab - 1501, n_vocab - 1608  # tiny.en's layout: specials between eot and timestamps
    fired = 0
    for timestamps in (True, False):
        spec = RuleSpec(n_vocab=n_vocab, eot=eot, no_timestamps=tb - 1, timestamp_begin=tb,
                        suppress=(1, 5, 7, 2051, eot + 1, eot + 2, tb - 1), blank=(220, eot),
                        timestamps=timestamps, max_initial_timestamp_index=50)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            B, ctx, begin = 128, 24, 3
            logits = (torch.randn(B, n_vocab) * 3).to(dtype)
            logits[::3, tb:] += 6.0  # timestamps outweigh the text on some rows
            logits[1, 100] = logits[1, 2100] = 50.0  # equal maxima in two blocks: the first wins
            logits[2, 7] = 80.0  # a suppressed token is never chosen
            logits[4, 220] = 80.0  # a blank is never the first sampled token
            tokens = torch.randint(0, n_vocab, (B, ctx))
            # Rows at the first sampled position, after one or two timestamps, after text: every
            # pair state, with and without an earlier timestamp to stay at or above.
            next_pos = torch.randint(begin, 12, (B,))
            last_ts = torch.randint(tb, n_vocab, (B,))
            last_ts = torch.where((torch.rand(B) < 0.3) | (next_pos == begin), -1, last_ts)
            starts = torch.full((B,), begin)
            rows = torch.arange(B)
            ts_last = torch.rand(B) < 0.5
            tokens[rows, next_pos - 1] = torch.where(ts_last, torch.randint(tb, n_vocab, (B,)), tokens[rows, next_pos - 1] % tb)
            # A text token and a timestamp tie, and no other timestamp adds mass: text, as argmax.
            logits[5] = -1e4
            logits[5, 300] = logits[5, tb + 10] = 60.0
            next_pos[5], last_ts[5], tokens[5, begin : begin + 2] = begin + 2, -1, torch.tensor([10, 11])
            args = [t.to(device) for t in (logits, tokens, next_pos, starts, last_ts)]
            chosen, logprob, no_speech = GreedySelect(spec, no_speech=eot + 3, device=device)(*args)
            filtered = LogitRules(spec, "cpu").apply(logits.float().clone(), tokens, next_pos, starts, last_ts)
            ref_chosen, ref_logprob = select_tokens(filtered, torch.zeros(B), None, None, False)
            ref_no_speech = torch.softmax(logits.float(), -1)[:, eot + 3]
            assert torch.equal(chosen.cpu(), ref_chosen), (timestamps, dtype, (chosen.cpu() != ref_chosen).nonzero())
            torch.testing.assert_close(logprob.cpu(), ref_logprob, rtol=1e-5, atol=1e-5, equal_nan=True)
            torch.testing.assert_close(no_speech.cpu(), ref_no_speech, rtol=1e-5, atol=1e-8)
            assert chosen[2] != 7 and (chosen[4] != 220 or next_pos[4] > begin) and chosen[5] == 300
            masked_text = filtered[:, :tb].isinf().all(1) & ~filtered[:, tb:].isinf().all(1)
            fired += int(masked_text.sum())
    assert fired > 10, fired  # the timestamp-mass rule decided some rows
    print("ok", fired)
    """
)


def _check(device: str, n_vocab: int, interpret: bool) -> None:
    env = dict(os.environ, **({"TRITON_INTERPRET": "1"} if interpret else {}))
    done = subprocess.run([sys.executable, "-c", CHECK, device, str(n_vocab)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


def test_fused_greedy_matches_tensor_rules_in_the_interpreter() -> None:
    _check("cpu", 5000, interpret=True)  # three blocks of text columns, one of timestamps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_greedy_matches_tensor_rules_on_the_gpu() -> None:
    _check("cuda", 51864, interpret=False)
