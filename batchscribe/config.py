"""Frozen configuration, built once at the edge (CLI or API caller) and passed down.

Nothing below this module reads the environment; `default_cache_dir` is the one place that does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batchscribe.constants import (
    COMPRESSION_RATIO_THRESHOLD,
    LOGPROB_THRESHOLD,
    NO_SPEECH_THRESHOLD,
)

Task = Literal["transcribe", "translate"]
DTypeName = Literal["float32", "float16", "bfloat16"]
DeviceName = str  # "cpu", "cuda", "cuda:1", or "auto"


# Language values that mean "detect it" (DecodeOptions.language None).
AUTO_LANGUAGE = ("auto", "")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the value, the limit and the fix."""


# weights/'s errors that are the user's to fix (exit code 2: an unknown name, a pickle-only or
# unreadable checkpoint, a model file whose sha256 differs from the pinned one). Matched by class
# name, so the CLI, --gpus children and the Ray driver need not import weights/ (which loads torch).
MODEL_ERROR_NAMES = ("ModelNotFoundError", "ModelFormatError", "Ct2FormatError", "ChecksumError")


def require_vad() -> None:
    """--vad's extra must be installed: a usage error before any model loads (found, not imported)."""
    if importlib.util.find_spec("silero_vad") is None:
        raise ConfigError("--vad needs the silero-vad package, which is not installed; "
                          "install it with: pip install 'batchscribe[vad]'")  # fmt: skip


def _temperature_ladder(value: object) -> tuple[float, ...]:
    """temperatures as given (a number or a sequence of numbers) -> a tuple of floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),)
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return tuple(float(t) for t in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ConfigError(f"temperatures={value!r} is not a number or a sequence of numbers; "
                          "e.g. 0.0 or (0.0, 0.2, 0.4)") from None


@dataclass(frozen=True)
class DecodeOptions:
    """How each 30 s window is decoded; the meaning of every field follows openai/whisper."""

    task: Task = "transcribe"
    language: str | None = None  # None (or "auto"): detect per item on multilingual models
    without_timestamps: bool = False
    # Temperature ladder: 0.0 is greedy; later entries are tried when a window fails the
    # compression-ratio or avg-logprob check (openai transcribe() fallback).
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = COMPRESSION_RATIO_THRESHOLD
    logprob_threshold: float | None = LOGPROB_THRESHOLD
    no_speech_threshold: float | None = NO_SPEECH_THRESHOLD
    sample_len: int | None = None  # max tokens sampled per window; None: n_text_ctx // 2
    max_initial_timestamp: float | None = 1.0
    suppress_blank: bool = True
    # "-1" means the non-speech symbol set plus the model's own suppress list (openai semantics).
    suppress_tokens: tuple[int, ...] | str = "-1"
    seed: int = 0
    # Word timestamps from the alignment heads' cross-attention (openai transcribe(word_timestamps=True));
    # the punctuation joined to the next / previous word, openai's defaults.
    word_timestamps: bool = False
    # Text before <|startoftranscript|> (after <|startofprev|>) for an item's first decoded window,
    # as openai transcribe(initial_prompt=...) without condition_on_previous_text.
    initial_prompt: str | None = None
    # Prompt each next window of an item with its previous windows' tokens (openai transcribe()'s
    # default, True there). Off here: batch labelling wants windows judged on their own audio, and a
    # window that drifted (a hallucination loop) would otherwise prompt the next into the same loop.
    condition_on_previous_text: bool = False
    # Decode only the speech Silero VAD finds, merged into chunks of at most 30 s that no window
    # crosses (faster-whisper's batched pipeline); times stay on the item's timeline.
    vad: bool = False
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"

    def __post_init__(self) -> None:
        if self.language is not None and self.language.strip().lower() in AUTO_LANGUAGE:
            # "auto" is what faster-whisper and the OpenAI API users type for "detect"; one value
            # for it keeps `--language auto` and no flag the same settings on resume.
            object.__setattr__(self, "language", None)
        if self.task not in ("transcribe", "translate"):
            raise ConfigError(f"task={self.task!r} is not supported; use 'transcribe' or 'translate'")
        # NOTE: options key the transcriber's engines (a dict), so a list here raised "unhashable
        # type" only at transcribe(). A single number is a one-step ladder, as openai's temperature=.
        object.__setattr__(self, "temperatures", _temperature_ladder(self.temperatures))
        if not isinstance(self.suppress_tokens, (str, tuple)) and isinstance(self.suppress_tokens, Iterable):
            object.__setattr__(self, "suppress_tokens", tuple(int(t) for t in self.suppress_tokens))
        if not self.temperatures:
            raise ConfigError("temperatures is empty; give at least one, e.g. (0.0,)")
        if any(t < 0 for t in self.temperatures):
            raise ConfigError(f"temperatures={self.temperatures} has a negative value; use values >= 0")
        if self.sample_len is not None and not 1 <= self.sample_len <= 448:
            raise ConfigError(f"sample_len={self.sample_len} is outside 1..448")
        if self.vad:
            require_vad()


@dataclass(frozen=True)
class EngineOptions:
    """Where and how the model runs, as asked for; engine/setup.py resolves it against the device
    and the model once."""

    device: DeviceName = "auto"
    dtype: DTypeName | None = None  # None: float16 on CUDA, float32 on CPU
    batch_size: int | None = None  # decoder slots; None: 16 on the CPU, sized from memory on CUDA
    cuda_graphs: bool = True
    # Attention kernels: "auto", one kernel for the decoder's two kinds, or "SELF/CROSS[/ENCODER]" (e.g.
    # "triton/flashinfer_hnd/fa3"; attention/names.py lists the kernels of each kind).
    attention: str = "auto"
    # Cross-attention K/V storage: "auto" keeps the model's dtype; "fp8" (e4m3) halves the bytes each
    # decode step reads (the bulk of a large model's step) at a small accuracy cost; "int4" (4 bits and
    # a scale per frame and head, attention/int4_cross.py) halves them again, at a larger one (docs/GPU_NOTES.md).
    cross_kv: Literal["auto", "fp8", "int4"] = "auto"
    # Encoder GEMMs: "auto" in the model's dtype; "fp8" (e4m3 weights per channel, activations per
    # token) makes a large model's compute-bound encoder faster on GPUs with fp8 tensor cores, at a
    # small accuracy cost (docs/GPU_NOTES.md). On the CPU fp8 is emulated: the same numbers, slowly.
    encoder_precision: Literal["auto", "fp8"] = "auto"
    # Records that do not depend on which items share the engine: windows encoded in chunks of one
    # size and every decode step run over all the slots, so a row's numbers never change with the
    # batch's shape (the kernels a GEMM picks depend on it). The same records from one GPU or eight,
    # Ray or --gpus, a resumed run or a fresh one. None: on with CUDA, where it costs nothing
    # measurable; off on the CPU, where MKL's reproducible mode costs ~15 % (docs/GPU_NOTES.md).
    batch_invariant: bool | None = None
    # Bytes of decoded audio the scheduler may hold in the items it is transcribing (an item keeps
    # its whole audio on the host until its last window); once they hold more, no new item is taken
    # until one finishes. None: a quarter of this machine's memory, split among --gpus children.
    audio_memory: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1")
        if self.audio_memory is not None and (isinstance(self.audio_memory, bool) or self.audio_memory < 1):
            raise ConfigError(f"audio_memory={self.audio_memory!r} must be a number of bytes >= 1, e.g. 8 << 30")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ConfigError(f"dtype={self.dtype!r}; use float32, float16 or bfloat16")
        if self.cross_kv not in ("auto", "fp8", "int4"):
            raise ConfigError(f"cross_kv={self.cross_kv!r}; use auto, fp8 or int4")
        if self.encoder_precision not in ("auto", "fp8"):
            raise ConfigError(f"encoder_precision={self.encoder_precision!r}; use auto or fp8")
        if self.batch_invariant not in (None, True, False):
            raise ConfigError(f"batch_invariant={self.batch_invariant!r}; use True, False or None (on with CUDA)")


def default_cache_dir() -> Path:
    """Where converted models are written: $BATCHSCRIBE_CACHE, else the user cache dir."""
    env = os.environ.get("BATCHSCRIBE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "batchscribe"
