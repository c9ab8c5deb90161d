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


@pytest.mark.parametrize("given, ladder", [(0, (0.0,)), (0.2, (0.2,)), ([0, 0.5], (0.0, 0.5)), ((0.0, 1), (0.0, 1.0))])
def test_temperatures_take_a_number_or_any_sequence(given: object, ladder: tuple[float, ...]) -> None:
    """openai's transcribe() takes temperature=0.2 or a tuple. A bare 0.0 was refused as "empty",
    0.2 raised "'float' object is not iterable", and a list built a Transcriber that then failed in
    transcribe() with "unhashable type: 'list'" (options key its engines)."""
    options = DecodeOptions(temperatures=given)  # type: ignore[arg-type]
    assert options.temperatures == ladder and all(type(t) is float for t in options.temperatures)
    assert options == DecodeOptions(temperatures=ladder) and {options: 1}[DecodeOptions(temperatures=ladder)] == 1


def test_suppress_tokens_as_a_list_is_hashable_and_equal_to_the_tuple() -> None:
    assert hash(DecodeOptions(suppress_tokens=[-1, 220])) == hash(DecodeOptions(suppress_tokens=(-1, 220)))  # type: ignore[arg-type]
    assert DecodeOptions(suppress_tokens="-1,220").suppress_tokens == "-1,220"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperatures="0,0.2"), r"temperatures='0,0.2' is not a number or a sequence of numbers"),
    (dict(temperatures=("hot",)), r"temperatures=\('hot',\) is not a number"),
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
    (dict(cross_kv="int8"), "cross_kv='int8'; use auto, fp8 or int4"),
    (dict(audio_memory=0), "audio_memory=0 must be a number of bytes >= 1"),
    (dict(audio_memory=True), "audio_memory=True must be a number of bytes"),
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
