"""The Ray Data stages: `decode_batch` (a CPU task: encoded audio -> 16 kHz float32 samples) and
`Transcribe` (a callable class: one engine per actor, loaded once). Neither imports ray: they are
plain functions of Ray Data's batches (dicts of columns), so they are tested without a cluster.

A batch row is (id, audio): `audio` a `{bytes, path}` struct as Hugging Face datasets store it
(or its decoded `{array, sampling_rate}`), encoded bytes, or a path, read as the plain run's
sources read it (`audio_value`). `decode_batch` turns it into `samples` (float32 bytes) or `error`, and
`Transcribe` accepts either form (raw rows it decodes itself, with `read=`: decode_batch's
keywords). Each output row is one record: `id`, `text`, `error` (None when ok) and `record`, the
whole verbose_json record as JSON, exactly what `batchscribe run` writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscribe.audio.sources import SourceError, SourceItem, shard_of
from batchscribe.audio.sources.columns import audio_value, prompt_value
from batchscribe.audio.sources.parquet import binary_views
from batchscribe.audio.worker import decode_one
from batchscribe.config import DecodeOptions, EngineOptions
from batchscribe.output.formats import jsonl_line
from batchscribe.output.records import error_record, jsonable, merge_record
from batchscribe.ray.feed import Feed

Batch = Mapping[str, Sequence[Any]]  # Ray Data's "default"/numpy batch: column name -> values


def decode_batch(batch: Batch, id_column: str = "id", audio_column: str = "audio", text_column: str | None = None,
                 passthrough: Sequence[str] = (), skip: frozenset[str] = frozenset(), num_shards: int = 1,
                 shard_index: int = 0, base_dir: str | None = None,
                 prompt_column: str | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Rows -> `id, samples (float32 bytes) | error, reference, extra (JSON), prompt` (the item's
    initial prompt from `prompt_column`, read as a plain run reads it: blank is none). Rows whose
    id is in `skip` (committed by an earlier run) or in another `--num-shards` part are dropped
    here, before any decoding. A bad file becomes an error (the plain run's message), never an
    exception."""
    wanted = (id_column, audio_column, text_column, prompt_column, *passthrough)
    missing = [c for c in wanted if c is not None and c not in batch]
    if missing:
        raise SourceError(f"decode_batch: no column {', '.join(map(repr, missing))} in the rows (columns: "
                          f"{', '.join(batch)}); name the right one with id_column=, audio_column=, text_column= "
                          "or passthrough=, or select it when reading")
    out: dict[str, list[Any]] = {"id": [], "samples": [], "error": [], "reference": [], "extra": [], "prompt": []}
    ids, folder = batch[id_column], None if base_dir is None else Path(base_dir)
    for i in range(len(ids)):
        item_id = str(ids[i])
        if not _to_do(item_id, skip, num_shards, shard_index):
            continue
        cell = batch[audio_column][i]
        data, path = audio_value(dict(cell) if isinstance(cell, Mapping) else cell, folder)  # as the plain run reads it
        samples, error = decode_one(SourceItem(item_id, data, path, None), None)
        text = batch[text_column][i] if text_column else None
        out["id"].append(item_id)
        out["samples"].append(None if samples is None else samples.tobytes())
        out["error"].append(None if error is None else f"{item_id}: {error}")  # as the decode pool names it
        out["reference"].append(None if text is None else str(text))
        out["extra"].append(json.dumps({c: jsonable(_plain(batch[c][i])) for c in passthrough}))
        out["prompt"].append(prompt_value(batch[prompt_column][i]) if prompt_column else None)
    return {k: np.array(v, dtype=object) for k, v in out.items()}


def keep_rows(batch: pa.Table, id_column: str = "id", skip: frozenset[str] = frozenset(), num_shards: int = 1,
              shard_index: int = 0) -> pa.Table:  # fmt: skip
    """The rows still to do, before they are cut into actor calls: ids not in `skip` (committed by
    an earlier run) and in this `--num-shards` part. Arrow in, Arrow out: nothing is decoded."""
    keep = [_to_do(i, skip, num_shards, shard_index) for i in batch.column(id_column).cast(pa.string()).to_pylist()]
    return batch if all(keep) else batch.filter(pa.array(keep, pa.bool_()))


def _to_do(item_id: str, skip: frozenset[str], num_shards: int, shard_index: int) -> bool:
    """Not committed by an earlier run, and in this --num-shards part."""
    return item_id not in skip and (num_shards == 1 or shard_of(item_id, num_shards) == shard_index)


def _str_or_none(value: Any) -> str | None:
    return str(value) if isinstance(value, (str, np.str_)) else None


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value.tolist() if isinstance(value, np.ndarray) else value


def cpu_actor_room() -> int:
    """How many actors with this one's CPUs Ray may place on its node: the node's CPUs over the
    CPUs Ray assigned to it; 1 outside a Ray actor (ray not imported or not initialised, a driver,
    a task) or for an actor assigned no CPUs."""
    ray = sys.modules.get("ray")  # a Ray worker has imported it; importing it here would cost ~1 s
    if ray is None or not ray.is_initialized():
        return 1
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:  # a driver or a task: no actor's resources to ask about
        return 1
    own = context.get_assigned_resources().get("CPU", 0.0)
    node = context.get_node_id()
    total = next((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("NodeID") == node), 0.0)
    return max(1, int(total // own)) if own > 0 else 1


class Transcribe:
    """`Dataset.map_batches(Transcribe, fn_constructor_kwargs={...}, num_gpus=1, concurrency=N)`.

    The constructor (run once per actor) loads `api.Transcriber(model, **options)`; each call
    adds its batch to the actor's one engine stream (ray/feed.py) and returns one record per row.
    Calls may run at once (`compute=ActorPoolStrategy(size=N, max_concurrent_calls_per_actor=6,
    enable_true_multi_threading=True)`, as `batchscribe run --ray` asks on a GPU: driver.py's
    `calls_per_actor`): the later batches then fill the slots while this one's last windows
    finish, instead of the engine draining at the end of every call.
    `describe=True` adds a `describe` column (the engine's resolved identity, as JSON), which the
    `batchscribe run --ray` driver checks against the folder before committing anything.
    Without `--audio-memory` each actor's decoded-audio budget is a share of its machine's default
    (engine/sizing.py), split among as many actors as may run there: at most `peers` (the pool's
    size), one per GPU for GPU actors, the node's CPUs over the actor's for CPU actors.
    """

    def __init__(self, model: str = "tiny.en", *, cache_dir: str | None = None, decode: DecodeOptions | None = None,
                 engine: EngineOptions | None = None, audio_column: str = "audio", id_column: str = "id",
                 describe: bool = False, read: Mapping[str, Any] | None = None, peers: int | None = None,
                 **options: Any) -> None:  # fmt: skip
        import dataclasses

        from batchscribe.api import Transcriber
        from batchscribe.engine.setup import resolve_device
        from batchscribe.engine.sizing import gpus_on_this_machine, host_audio_bytes

        # Several actors share a node's memory: by default each takes its share of the audio budget.
        # Ray places at most one GPU actor per GPU, and CPU actors by their CPUs; `peers` (the pool's
        # size, which the driver passes) bounds both. Engine keywords in `options` (device=...) are
        # Transcriber's spelling of the same EngineOptions.
        if engine is None:
            given = [f.name for f in dataclasses.fields(EngineOptions) if f.name in options]
            engine = EngineOptions(**{k: options.pop(k) for k in given})
        if engine.audio_memory is None:
            room = gpus_on_this_machine() if resolve_device(engine.device).type == "cuda" else cpu_actor_room()
            engine = dataclasses.replace(engine, audio_memory=host_audio_bytes(engines=min(room, peers or room)))
        self.transcriber = Transcriber(model=model, cache_dir=cache_dir, decode=decode, engine=engine, **options)
        self.feed = Feed(self.transcriber)  # one engine stream for every call, however many run at once
        # How a raw row is decoded here: decode_batch's keywords (the driver passes the run's columns)
        self.read = {"id_column": id_column, "audio_column": audio_column, **(read or {})}
        self.described = json.dumps(jsonable(self.transcriber.describe())) if describe else None
        # On a GPU: pinned memory for each row's samples, copied there on the call's thread, so
        # admission sends them by DMA instead of packing them on the engine's thread (the plain
        # run's decode threads decode into the same arena). None on the CPU. It builds the engine
        # now, in the actor's start-up, not in its first call.
        self.allocate = self.transcriber.host_allocator()

    def __call__(self, batch: Batch | pa.Table) -> dict[str, np.ndarray]:
        batch = _as_columns(batch)
        if "samples" not in batch:  # raw rows: decoded on this call's thread while the engine steps
            batch = decode_batch(batch, **self.read)
        ids = [str(i) for i in batch["id"]]
        extras = [json.loads(e) if isinstance(e, str) else {} for e in batch.get("extra", [None] * len(ids))]
        # NOTE: Ray may hand a column of Nones back as floats (NaN): only a str is a value here.
        refs = [_str_or_none(v) for v in batch.get("reference", [None] * len(ids))]
        errors = [_str_or_none(v) for v in batch.get("error", [None] * len(ids))]
        prompts = [_str_or_none(v) for v in batch.get("prompt", [None] * len(ids))]
        records: dict[str, dict[str, Any]] = {}
        todo = []
        for k, item_id in enumerate(ids):
            samples, error = batch["samples"][k], errors[k]
            if not isinstance(samples, (bytes, np.bytes_, memoryview)):
                records[item_id] = error_record(item_id, error or "no audio decoded", refs[k], extras[k])
            else:
                audio = self._staged(np.frombuffer(samples, dtype=np.float32))
                todo.append((item_id, audio, prompts[k]) if prompts[k] else (item_id, audio))
        row = {item_id: k for k, item_id in enumerate(ids)}
        for (item_id, *_), future in zip(todo, self.feed.submit(todo)):
            k = row[item_id]
            records[item_id] = merge_record(future.result(), refs[k], extras[k])
        done = [records[i] for i in ids]
        out = {"id": ids, "text": [r.get("text") for r in done], "error": [r.get("error") for r in done],
               "record": [jsonl_line(r) for r in done]}  # fmt: skip
        if self.described is not None:
            out["describe"] = [self.described] * len(ids)
        return {k: np.array(v, dtype=object) for k, v in out.items()}

    def _staged(self, audio: np.ndarray) -> np.ndarray:
        """[n] float32 samples in the engine's pinned arena when it has one (else as they are)."""
        if self.allocate is None:
            return audio
        pinned = self.allocate(audio.size)
        pinned[...] = audio  # numpy copies without the GIL, which the engine's thread needs
        return pinned


def _as_columns(batch: Batch | pa.Table) -> Batch:
    """A batch as columns of Python values. From Arrow (`batch_format="pyarrow"`, as the driver
    asks for), decoded samples stay views of the block's buffer: Ray's numpy batches copy every
    row into a new bytes object, holding the GIL that the actor's engine thread waits for."""
    if not isinstance(batch, pa.Table):
        return batch
    columns: dict[str, list[Any]] = {}
    for name in batch.column_names:
        column = batch.column(name)
        if name == "samples" and (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            columns[name] = [view for chunk in column.chunks for view in binary_views(chunk)]
        else:
            columns[name] = column.to_pylist()
    return columns
