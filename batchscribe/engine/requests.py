"""What the scheduler and the slots exchange: a window to decode, and a window decoded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LANGUAGE_POSITION = 1  # <|startoftranscript|> <|xx|> <|task|> ...: the language token's index after sot


@dataclass(frozen=True)
class WindowRequest:
    """One window to decode: up to 30 s of 16 kHz audio and how to decode it."""

    key: int  # the caller's handle for this window
    audio: np.ndarray  # [n <= N_SAMPLES] float32
    prompt: tuple[int, ...]  # forced prefix; a language placeholder sits at LANGUAGE_POSITION if detecting
    detect_language: bool
    temperature: float
    noise_key: int = 0  # sampling key: the same key samples the same tokens in any slot or batch
    # Where <|startoftranscript|> sits: 0, or after <|startofprev|> and an initial prompt, whose
    # tokens are prefilled at admission (engine/prefill.py) instead of fed one per step.
    sot_index: int = 0


@dataclass(frozen=True)
class FinishedWindow:
    """A decoded window, read back from a snapshot of its slot."""

    key: int
    tokens: list[int]  # sampled tokens, end-of-text removed
    sum_logprob: float
    no_speech_prob: float
    language_token: int | None  # the token LANGUAGE_POSITION after sot (detected or forced), if any
    temperature: float
    hit_eot: bool
    slot: int | None = None  # the slot it was read from (its cross K/V stay there until the next admission)
