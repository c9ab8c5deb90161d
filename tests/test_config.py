"""config.py: DecodeOptions and EngineOptions check what they are given once, at the edge."""

from __future__ import annotations

import pytest

from batchscribe.config import ConfigError, DecodeOptions, EngineOptions


@pytest.mark.parametrize("language", ["auto", "AUTO", " Auto ", ""])
def test_language_auto_means_detect(language: str) -> None:
    """`auto` is "detect" (language=None), so a resume sees the same settings as no language at all."""
    assert DecodeOptions(language=language).language is None
    assert DecodeOptions(language=language) == DecodeOptions()


def test_a_named_language_is_kept() -> None:
    assert DecodeOptions(language="de").language == "de" and DecodeOptions(language="German").language == "German"


@pytest.mark.parametrize("kwargs, message", [
    (dict(task="summarize"), "task='summarize'.*'transcribe' or 'translate'"),
    (dict(temperatures=()), "temperatures is empty"),
    (dict(temperatures=(0.0, -0.2)), "negative"),
    (dict(sample_len=449), "outside 1..448"),
])
def test_decode_options_refuse_with_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DecodeOptions(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size=0 must be >= 1"),
    (dict(dtype="int8"), "dtype='int8'; use float32, float16 or bfloat16"),
    (dict(cross_kv="int8"), "cross_kv='int8'; use auto or fp8"),
])
def test_engine_options_refuse_with_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineOptions(**kwargs)


def test_model_error_names_are_the_weights_error_classes() -> None:
    """The CLI, --gpus children and the Ray driver match weights/'s errors by these names: a
    renamed class would silently turn a usage error (exit 2) into a crash (exit 1)."""
    import batchscribe.weights as weights
    from batchscribe.config import MODEL_ERROR_NAMES

    classes = [getattr(weights, name) for name in MODEL_ERROR_NAMES]
    assert all(isinstance(c, type) and issubclass(c, Exception) for c in classes)
    defined = {n for n in dir(weights) if n.endswith("Error") and isinstance(getattr(weights, n), type)}
    assert defined == set(MODEL_ERROR_NAMES)  # and a new one is listed
