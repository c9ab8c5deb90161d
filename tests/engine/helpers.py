"""What the engine tests share: record checks against the OpenAI SDK's types, and runs of a
scheduler with a policy, as records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from batchscribe.output.verbose_json import transcript_record

GREEDY = dict(temperatures=(0.0,))


def greedy_transcriber(model_dir):
    """Real tiny.en on the CPU, 4 slots, greedy: what the end-to-end engine tests share."""
    from batchscribe.api import Transcriber

    return Transcriber(str(model_dir), device="cpu", batch_size=4, **GREEDY)


def openai_wer(ref: str, hyp: str) -> float:
    """WER after openai-whisper's English normaliser (jiwer)."""
    import jiwer
    import pytest

    normalizers = pytest.importorskip("whisper.normalizers")
    norm = normalizers.EnglishTextNormalizer()
    return jiwer.wer(norm(ref), norm(hyp))


def check_record(record: dict) -> None:
    """A record validates as the OpenAI SDK's TranscriptionVerbose, segments in order within it."""
    from openai.types.audio import TranscriptionSegment, TranscriptionVerbose

    TranscriptionVerbose.model_validate(record)
    previous_end = 0.0
    for seg in record["segments"]:
        TranscriptionSegment.model_validate(seg)
        assert previous_end <= seg["start"] <= seg["end"] <= record["duration"]
        previous_end = seg["end"]
    assert record["text"] == "".join(s["text"] for s in record["segments"])


def records(scheduler: Any, items: Iterable[tuple[str, np.ndarray]], **policy: Any) -> list[dict]:
    """The scheduler's records for `items` in input order, under its policy with `policy` changed."""
    items = list(items)
    order = {item_id: i for i, (item_id, _) in enumerate(items)}
    run = scheduler.run(items, replace(scheduler.policy, **policy))
    return sorted((transcript_record(t) for t in run), key=lambda r: order[r["id"]])


def tokens(records: list[dict]) -> dict[str, list[int]]:
    return {r["id"]: [t for s in r["segments"] for t in s["tokens"]] for r in records}


def token_differences(a: dict[str, list[int]], b: dict[str, list[int]]) -> str:
    """Where two runs' tokens part, per id: the first differing position and a few tokens either
    side, so a failed equality shows whether a near-tie flipped (same prefix, one token) or
    something broke (an early or wholesale difference)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if x is None or y is None:
            lines.append(f"{key}: only in {'the second' if x is None else 'the first'} run")
            continue
        i = next((j for j, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
        lines.append(f"{key}: first difference at token {i} of {len(x)} / {len(y)}: "
                     f"{x[max(0, i - 3):i + 3]} != {y[max(0, i - 3):i + 3]}")  # fmt: skip
    return "; ".join(lines)


def openai_model(model_dir):
    """openai-whisper's own Whisper model holding our checkpoint's weights (float32, CPU), with the
    alignment heads the checkpoint lists: the independent reference for word timestamps."""
    import json

    import pytest
    import torch

    whisper_model = pytest.importorskip("whisper.model")
    from batchscribe.model.dims import ModelDims
    from batchscribe.weights import load_state_dict
    from tests.engine.test_windows import _to_openai_names

    config = json.loads((model_dir / "config.json").read_text())
    d = ModelDims.from_hf_config(config)
    dims = whisper_model.ModelDimensions(n_mels=d.n_mels, n_audio_ctx=d.n_audio_ctx, n_audio_state=d.n_audio_state,
                                         n_audio_head=d.n_audio_head, n_audio_layer=d.n_audio_layer,
                                         n_vocab=d.n_vocab, n_text_ctx=d.n_text_ctx, n_text_state=d.n_text_state,
                                         n_text_head=d.n_text_head, n_text_layer=d.n_text_layer)  # fmt: skip
    model = whisper_model.Whisper(dims)
    model.load_state_dict(_to_openai_names(load_state_dict(model_dir)))
    heads = json.loads((model_dir / "generation_config.json").read_text())["alignment_heads"]
    mask = torch.zeros(d.n_text_layer, d.n_text_head, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model.eval()


def aligner_over(model, audios: list[np.ndarray], eot: int, no_timestamps: int, max_batch: int, graphs: bool = False,
                 in_place: bool | None = None, hnd: bool = False):  # fmt: skip
    """An Aligner (engine/alignment.py) and the slots it reads: window k's cross K/V encoded from
    audios[k] into slot k of a fresh decoder cache (heads first with `hnd`), as admission leaves
    them (on the model's device). `in_place`: the Aligner's choice of cross-attention kernel."""
    import torch

    from batchscribe.audio.features import LogMel
    from batchscribe.constants import N_SAMPLES
    from batchscribe.engine.alignment import Aligner
    from batchscribe.model.alignment_heads import resolve_alignment_heads
    from batchscribe.model.cache import DecoderCache

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    cache = DecoderCache.allocate(model.dims, len(audios), device, dtype, cross_hnd=hnd)
    audio = torch.zeros(len(audios), N_SAMPLES)
    for k, a in enumerate(audios):
        audio[k, : len(a)] = torch.from_numpy(a[:N_SAMPLES])
    with torch.no_grad():
        enc = model.encoder(LogMel(model.dims.n_mels, device=device)(audio.to(device)).to(dtype))
        model.write_cross_kv(cache, enc, torch.arange(len(audios), device=device))
    heads = resolve_alignment_heads({}, model.dims, ("tiny.en",), "tiny.en")
    return Aligner(model, cache, heads, eot, no_timestamps, max_batch=max_batch, graphs=graphs, in_place=in_place)
