"""The Python entry point: `Transcriber` turns audio arrays into verbose_json records.

    from batchscribe import Transcriber
    t = Transcriber("tiny.en")
    records = t.transcribe([("utt1", audio1), ("utt2", audio2)])  # float32 mono 16 kHz arrays
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchscribe.config import ConfigError, DecodeOptions, EngineOptions
from batchscribe.engine.kernels import AttentionKinds
from batchscribe.engine.engine import Engine
from batchscribe.engine.graphs import slots_for_memory
from batchscribe.model.dims import ModelDims
from batchscribe.model.loading import load_state_dict, resolve_model
from batchscribe.model.tokenizer import Tokenizer
from batchscribe.model.whisper import DecoderCache, Whisper

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelInfo:
    name: str  # as the user gave it
    path: str  # the resolved Hugging Face folder
    dims: ModelDims
    device: str
    dtype: str
    attention: str = "sdpa"  # self-attention kernel / cross-attention kernel / cross K/V dtype


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but CUDA is not available here; use --device cpu or auto")
    return torch.device(device)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


class Transcriber:
    """Loads a Whisper model once and transcribes arrays or streams of (id, array) items."""

    def __init__(
        self,
        model: str = "tiny.en",
        device: str = "auto",
        dtype: str | None = None,
        batch_size: int | None = None,
        cache_dir: str | Path | None = None,
        cuda_graphs: bool = True,
        attention: str = "auto",
        cross_kv: str = "auto",
        decode: DecodeOptions | None = None,
        **decode_options: Any,
    ):
        known = {f.name for f in fields(DecodeOptions)}
        unknown = set(decode_options) - known
        if unknown:
            raise ConfigError(f"unknown decoding option(s) {sorted(unknown)}; known: {sorted(known)}")
        if decode is not None and decode_options:
            raise ConfigError("pass either decode=DecodeOptions(...) or keyword options, not both")
        self.options = decode or DecodeOptions(**decode_options)
        self.engine_options = EngineOptions(device=device, dtype=dtype, batch_size=batch_size, cuda_graphs=cuda_graphs,
                                            attention=attention, cross_kv=cross_kv)  # fmt: skip
        self.device = resolve_device(device)
        dtype_name = dtype or ("float16" if self.device.type == "cuda" else "float32")
        try:
            self.attention = AttentionKinds.resolve(attention, cross_kv, self.device, _DTYPES[dtype_name])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        folder = resolve_model(model, cache_dir=Path(cache_dir) if cache_dir else None)
        config = _read_json(folder / "config.json")
        dims = ModelDims.from_hf_config(config)
        self.tokenizer = Tokenizer.from_folder(folder, multilingual=dims.is_multilingual)
        if self.options.language is not None:
            self.tokenizer.sot_sequence(self.options.language, self.options.task)  # validates early
        self.model = Whisper(dims).eval()
        self.model.load_hf_state_dict(load_state_dict(folder))
        self.model.to(device=self.device, dtype=_DTYPES[dtype_name])
        generation = _read_json(folder / "generation_config.json")
        self.model_suppress = list(generation.get("suppress_tokens") or config.get("suppress_tokens") or [])
        kinds = self.attention
        cross_dtype = str(kinds.cross_dtype or _DTYPES[dtype_name]).removeprefix("torch.")
        self.model_info = ModelInfo(model, str(folder), dims, str(self.device), dtype_name,
                                    f"{kinds.self_attention}/{kinds.cross_attention}/{cross_dtype}")  # fmt: skip
        self.n_slots = batch_size or self._default_slots(dims, _DTYPES[dtype_name], self.attention.cross_dtype)
        self._engines: dict[DecodeOptions, Engine] = {}

    def _default_slots(self, dims: ModelDims, dtype: torch.dtype, cross_dtype: torch.dtype | None) -> int:
        if self.device.type != "cuda":
            return 16
        free, _ = torch.cuda.mem_get_info(self.device)
        per_slot = DecoderCache.bytes_per_slot(dims, dtype, cross_dtype)
        # 256: on the H200, 512 slots made large-v3 4 % faster (W2) but tiny.en's host admission
        # slower (groups twice the size); pass batch_size for more.
        fit = slots_for_memory(free, per_slot, cap=256)
        log.info("decoder slots: %d (%.1f MB of cache per slot, %.1f GB free)", fit, per_slot / 1e6, free / 1e9)
        return fit

    def _engine(self, options: DecodeOptions) -> Engine:
        # Engines hold the static caches and captured graphs: build once per option set.
        if options not in self._engines:
            self._engines[options] = Engine(
                self.model,
                self.tokenizer,
                options,
                self.model_suppress,
                self.device,
                n_slots=self.n_slots,
                cuda_graphs=self.engine_options.cuda_graphs,
                attention=self.attention,
            )
        return self._engines[options]

    def host_allocator(self, options: DecodeOptions | None = None) -> Callable[[int], np.ndarray] | None:
        """For decode threads feeding `transcribe_stream` on a GPU: `allocate(n_samples)` gives pinned
        host memory to decode into (`decode_audio(allocate=...)`), which admission copies to the
        device without packing it first. None on the CPU. Builds the engine (and its arena) first."""
        if self.device.type != "cuda":
            return None
        arena = self._engine(options or self.options).decoder.enable_arena()
        return None if arena is None else arena.allocate

    def transcribe_stream(
        self, items: Iterable[tuple[str, np.ndarray]], options: DecodeOptions | None = None
    ) -> Iterator[dict]:
        """Records as items finish (not input order). Audio: float32 mono 16 kHz arrays."""
        yield from self._engine(options or self.options).transcribe_stream(items)

    def transcribe(
        self,
        audio: np.ndarray | Sequence[np.ndarray] | Sequence[tuple[str, np.ndarray]],
        options: DecodeOptions | None = None,
    ) -> list[dict] | dict:
        """One array -> one record; a list of arrays or (id, array) pairs -> records in input order."""
        single = isinstance(audio, np.ndarray) and audio.ndim == 1
        batch = [audio] if single else list(audio)
        items = [x if isinstance(x, tuple) else (str(i), x) for i, x in enumerate(batch)]
        order = {item_id: i for i, (item_id, _) in enumerate(items)}
        if len(order) != len(items):
            raise ConfigError("item ids must be unique within one transcribe() call")
        records = sorted(self.transcribe_stream(items, options), key=lambda r: order[r["id"]])
        return records[0] if single else records

    def describe(self) -> dict[str, Any]:
        """Model and options, for summaries and run manifests."""
        info = asdict(self.model_info)
        return {"model": info, "decode": asdict(self.options), "batch_size": self.n_slots}
