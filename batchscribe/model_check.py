"""A model's files and the usage checks that need no weights: the name resolved to its folder,
its config, dims and tokenizer, and whether the decoding and engine options fit it.

`run()` checks before it makes the output folder (a folder's lock files are never removed, see
output/lock.py), then hands the same `ModelFiles` to the Transcriber, which loads the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from batchscribe.config import ConfigError, DecodeOptions, EngineOptions, default_cache_dir
from batchscribe.engine.setup import EngineConfig, resolve_engine
from batchscribe.model.alignment_heads import Heads, resolve_alignment_heads
from batchscribe.model.dims import ModelDims
from batchscribe.model.tokenizer import Tokenizer, TokenizerError
from batchscribe.weights import resolve_model


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


@dataclass(frozen=True)
class ModelFiles:
    """What a model name resolves to, read once: everything but the weights."""

    name: str  # as the user gave it
    folder: Path  # the resolved Hugging Face folder
    cache: Path
    config: dict[str, Any]
    generation: dict[str, Any]
    dims: ModelDims

    @classmethod
    def resolve(cls, name: str, cache_dir: str | Path | None = None) -> ModelFiles:
        """Raises ModelNotFoundError / ModelFormatError (weights/) for a name that resolves to no model."""
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        folder = resolve_model(name, cache_dir=cache)
        config = _read_json(folder / "config.json")
        dims = ModelDims.from_hf_config(config)
        return cls(name, folder, cache, config, _read_json(folder / "generation_config.json"), dims)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """Read at first use (check() uses it): a run starts the GPU libraries' loading between
        resolve() and check(), so that they load while this is read."""
        return Tokenizer.from_folder(self.folder, multilingual=self.dims.is_multilingual)

    @property
    def origin(self) -> str:
        """The alias a converted folder was made from ("alias tiny.en" -> "tiny.en"), else ""."""
        return str(_read_json(self.folder / "batchscribe_source.json").get("origin", "")).removeprefix("alias ")

    def alignment_heads(self) -> Heads:
        """--word-timestamps' heads; a model without them is a usage error."""
        return resolve_alignment_heads(self.generation, self.dims, (self.name, self.folder.name, self.origin),
                                       self.name)  # fmt: skip

    def check(self, options: DecodeOptions, engine: EngineOptions) -> EngineConfig:
        """The engine resolved for this model; ConfigError for a language, task or engine option it
        cannot do, or --word-timestamps on a model without alignment heads."""
        resolved = resolve_engine(engine, self.dims)
        check_language_and_task(self.tokenizer, options)
        if options.word_timestamps:
            self.alignment_heads()
        return resolved


def check_language_and_task(tokenizer: Tokenizer, options: DecodeOptions) -> None:
    """A language or task the model cannot do is a usage error, found before the weights load."""
    try:
        tokenizer.sot_sequence(options.language, options.task)
    except TokenizerError as exc:
        flag = "--task" if options.task != "transcribe" and "task" in str(exc) else "--language"
        raise ConfigError(f"{exc} (check {flag})") from exc
    if options.initial_prompt and tokenizer.is_multilingual and options.language is None:
        # openai detects the language from the audio alone; here detection happens in the window's
        # own decode, where a prompt before <|startoftranscript|> would sway it.
        raise ConfigError("--initial-prompt with a multilingual model needs --language (e.g. --language en): "
                          "the language is detected in the same decode the prompt conditions")
