"""Which decoder cross-attention heads follow the audio in time: what word timestamps read.

A Hugging Face checkpoint lists them in generation_config.json (`alignment_heads`: [[layer, head],
...]); converted CTranslate2 folders carry them there too. For OpenAI's own checkpoints without
that file, the table below holds the heads openai-whisper ships for each model (its
`_ALIGNMENT_HEADS`, decoded: tests/model/test_alignment_heads.py checks the table against it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchscribe.config import ConfigError
from batchscribe.model.dims import ModelDims

Heads = tuple[tuple[int, int], ...]  # (decoder layer, head)

OPENAI_ALIGNMENT_HEADS: dict[str, Heads] = {
    "tiny.en": ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),
    "tiny": ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)),
    "base.en": ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)),
    "base": ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),
    "small.en": ((6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0), (9, 4), (9, 8), (9, 10), (10, 0),
                 (10, 1), (10, 2), (10, 3), (10, 6), (10, 11), (11, 2), (11, 4)),
    "small": ((5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7), (9, 9), (10, 5)),
    "medium.en": ((11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4), (16, 9), (17, 12), (17, 14),
                  (18, 7), (18, 10), (18, 15), (20, 0), (20, 3), (20, 9), (20, 14), (21, 12)),
    "medium": ((13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)),
    "large-v1": ((9, 19), (11, 2), (11, 4), (11, 17), (22, 7), (22, 11), (22, 17), (23, 2), (23, 15)),
    "large-v2": ((10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15), (17, 16), (18, 4), (18, 11),
                 (18, 19), (19, 11), (21, 2), (21, 3), (22, 3), (22, 9), (22, 12), (23, 5), (23, 7), (23, 13),
                 (25, 5), (26, 1), (26, 12), (27, 15)),
    "large-v3": ((7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11), (21, 4), (24, 1), (25, 6)),
    "large-v3-turbo": ((2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)),
}  # fmt: skip
_SYNONYMS = {"large": "large-v3", "turbo": "large-v3-turbo"}


def _dims_key(dims: ModelDims) -> tuple[int, int, int, int]:
    return dims.n_mels, dims.n_vocab, dims.n_text_layer, dims.n_text_head


# Architecture -> model, for the OpenAI models no other has the same shape (large-v1 and -v2 share
# one, so they are found by name only).
_BY_SHAPE: dict[tuple[int, int, int, int], str] = {
    (80, 51864, 4, 6): "tiny.en", (80, 51865, 4, 6): "tiny", (80, 51864, 6, 8): "base.en",
    (80, 51865, 6, 8): "base", (80, 51864, 12, 12): "small.en", (80, 51865, 12, 12): "small",
    (80, 51864, 24, 16): "medium.en", (80, 51865, 24, 16): "medium", (128, 51866, 32, 20): "large-v3",
    (128, 51866, 4, 20): "large-v3-turbo",
}  # fmt: skip


def _table_name(names: tuple[str, ...]) -> str | None:
    """An OpenAI model name among `names` (an alias, "openai/whisper-small.en", a folder's name)."""
    for raw in names:
        name = raw.strip().lower().rstrip("/").rsplit("/", 1)[-1].removeprefix("whisper-")
        name = _SYNONYMS.get(name, name)
        if name in OPENAI_ALIGNMENT_HEADS:
            return name
    return None


def resolve_alignment_heads(generation_config: Mapping[str, Any], dims: ModelDims, names: tuple[str, ...],
                            model_label: str) -> Heads:  # fmt: skip
    """The checkpoint's heads, else the OpenAI table's by name, else by architecture; a model with
    none is a usage error naming it and the fix."""
    listed = generation_config.get("alignment_heads")
    if listed:
        heads = tuple((int(layer), int(head)) for layer, head in listed)
    else:
        name = _table_name(names) or _BY_SHAPE.get(_dims_key(dims))
        if name is None:
            raise ConfigError(
                f"model {model_label!r} lists no alignment heads (generation_config.json has no "
                "'alignment_heads') and is not one of OpenAI's models, so --word-timestamps cannot time its "
                "words; add 'alignment_heads': [[layer, head], ...] to its generation_config.json, use an "
                f"OpenAI model ({', '.join(OPENAI_ALIGNMENT_HEADS)}), or drop --word-timestamps"
            )
        heads = OPENAI_ALIGNMENT_HEADS[name]
    bad = [(la, h) for la, h in heads if not (0 <= la < dims.n_text_layer and 0 <= h < dims.n_text_head)]
    if bad:
        raise ConfigError(f"model {model_label!r}: alignment heads {bad[:4]} lie outside its {dims.n_text_layer} "
                          f"decoder layers x {dims.n_text_head} heads; fix 'alignment_heads' in its "
                          "generation_config.json or drop --word-timestamps")
    return heads
