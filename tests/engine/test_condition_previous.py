"""--condition-on-previous-text (windows.py's item context, prefilled like an initial prompt): on the
long-form files with real tiny.en the windows equal openai-whisper's transcribe(condition_on_previous_text=
True) wherever the decoded tokens agree; the planner's context follows openai's all_tokens and
prompt_reset_since (kept tokens appended, reset above temperature 0.5, an initial prompt first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchscribe.config import DecodeOptions
from batchscribe.engine.requests import FinishedWindow
from batchscribe.engine.windows import MAX_PROMPT_TOKENS, WindowPlanner
from batchscribe.model.tokenizer import Tokenizer
from tests.engine.helpers import GREEDY, openai_model

whisper = pytest.importorskip("whisper")


def _long_files(shared_data) -> list[tuple[str, np.ndarray]]:
    """Two ~60 s earnings calls and the first two minutes of a LibriSpeech chapter: conditioning
    needs several windows per item; two minutes keep the CPU run short."""
    from batchscribe.audio.decode import decode_audio

    longform = shared_data / "longform"
    paths = sorted((longform / "earnings22").glob("*.wav")) + [longform / "librispeech-concat" / "32-21631-longform.flac"]
    return [(p.stem, decode_audio(str(p))[: 120 * 16000]) for p in paths]


def _windows(segments: list[dict]) -> list[tuple[int, list[int]]]:
    """(seek, the window's tokens) in order: segments of one window share their seek."""
    out: list[tuple[int, list[int]]] = []
    for seg in segments:
        if out and out[-1][0] == seg["seek"]:
            out[-1][1].extend(seg["tokens"])
        else:
            out.append((seg["seek"], list(seg["tokens"])))
    return out


def _kept(tokens: list[int], timestamp_begin: int) -> list[int]:
    """The tokens openai transcribe() keeps of a decoded window: up to its last pair of
    consecutive timestamps (what follows has no closing timestamp), else all of them."""
    ts = [t >= timestamp_begin for t in tokens]
    pairs = [i + 1 for i in range(len(tokens) - 1) if ts[i] and ts[i + 1]]
    single_ending = len(ts) >= 2 and ts[-1] and not ts[-2]
    if not pairs:
        return tokens
    return tokens if single_ending else tokens[: pairs[-1]]


def test_conditioned_windows_equal_openai_decode(tiny_en_dir, shared_data) -> None:
    """Each window, decoded by openai-whisper's DecodingTask on the same log-mel with the prompt
    openai transcribe() builds from the item's earlier windows (greedy: no reset), gives our tokens.
    Per window, not per transcript: openai's log-mel of the whole file differs from a window's own
    at the window's edge, and one differing token would make every later window incomparable."""
    from batchscribe.api import Transcriber
    from batchscribe.audio.features import LogMel
    from batchscribe.constants import HOP_LENGTH, N_SAMPLES

    items = _long_files(shared_data)
    ours = Transcriber(str(tiny_en_dir), device="cpu", batch_size=4, condition_on_previous_text=True, **GREEDY)
    records = ours.transcribe(items, sample_rate=16000)
    reference, features = openai_model(tiny_en_dir), LogMel(80)
    same = total = prompted = 0
    tb = Tokenizer.from_folder(tiny_en_dir).timestamp_begin
    for (item_id, audio), record in zip(items, records):
        context: list[int] = []  # openai's all_tokens since the last reset
        for seek, window in _windows(record["segments"]):
            padded = torch.zeros(N_SAMPLES)
            chunk = torch.from_numpy(audio[seek * HOP_LENGTH : seek * HOP_LENGTH + N_SAMPLES])
            padded[: len(chunk)] = chunk
            options = whisper.DecodingOptions(prompt=list(context), temperature=0.0, language="en", fp16=False)
            ref = whisper.decode(reference, features(padded[None])[0], options)
            same, total, prompted = same + (_kept(ref.tokens, tb) == window), total + 1, prompted + bool(context)
            context.extend(window)
    print(f"\n{same}/{total} conditioned windows ({prompted} with a prompt) decode to openai-whisper's tokens")
    assert prompted >= total - len(items) and same >= 0.9 * total


def _finished(tok: Tokenizer, key: int, words: str, temperature: float = 0.0) -> FinishedWindow:
    tb = tok.timestamp_begin
    return FinishedWindow(key, [tb, *tok.encode(words), tb + 100], -0.5, 0.01, None, temperature, True)


def test_context_follows_openai_all_tokens(tiny_en_dir) -> None:
    tok = Tokenizer.from_folder(tiny_en_dir)
    options = DecodeOptions(condition_on_previous_text=True, initial_prompt="Kenobi.", temperatures=(0.0, 0.6))
    planner = WindowPlanner(tok, options)
    item = planner.start("a", np.zeros(16000 * 200, dtype=np.float32))
    initial = tuple(tok.encode(" Kenobi."))
    assert planner.request(0, item).prompt == (tok.sot_prev, *initial, tok.sot)
    first = _finished(tok, 0, " Hello there.")
    planner.fold(item, first)
    # openai: all_tokens = initial prompt + the kept window's tokens (timestamps included).
    assert planner.request(1, item).prompt == (tok.sot_prev, *initial, *first.tokens, tok.sot)
    for k in range(2, 40):  # the context grows; only its last 223 tokens are sent
        planner.fold(item, _finished(tok, k, " General Kenobi, you are a bold one."))
    request = planner.request(40, item)
    assert request.sot_index == 1 + MAX_PROMPT_TOKENS and request.prompt[1:-1] == item.context[-MAX_PROMPT_TOKENS:]
    # A window kept at temperature 0.6 (> 0.5) resets the context: the next window has no prompt.
    planner.fold(item, _finished(tok, 41, " Hot.", temperature=0.0))
    item.temp_index = 1
    planner.fold(item, _finished(tok, 42, " Sampled hot.", temperature=0.6))
    assert planner.request(43, item).prompt == (tok.sot,)
    planner.fold(item, _finished(tok, 43, " Back."))
    assert planner.request(44, item).prompt == (tok.sot_prev, *_finished(tok, 0, " Back.").tokens, tok.sot)
