"""batchscribe on Ray Data: the engine as a callable class for `Dataset.map_batches`.

`batchscribe run INPUT -o OUT --ray [ADDRESS] --ray-workers N` runs this pipeline and commits the
records exactly once into OUT (driver.py, commit.py). In your own Ray Data pipeline, use the stages
directly (actor.py); this module does not import ray itself.

A complete example (runs as it is on a laptop; on a cluster, `ray.init("auto")`)::

    import json

    import ray

    from batchscribe.ray import Transcribe, decode_batch

    ray.init()
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    rows = 256 if gpus else 16  # rows per actor call: the engine's default slots
    ds = ray.data.read_parquet("data/test-*.parquet").select_columns(["id", "audio", "text"])
    # One block per actor call: Ray Data hands a task's rows on only when its whole block is done,
    # and a Parquet row group (thousands of rows) would be one block on one actor.
    ds = ds.repartition(target_num_rows_per_block=rows)
    # CPU tasks: encoded audio ({bytes, path} structs, bytes or paths) -> 16 kHz float32 samples
    ds = ds.map_batches(decode_batch, batch_size=rows, num_cpus=0.25, fn_kwargs={"text_column": "text"})
    # One engine per actor, the model loaded once per actor: one GPU each, or half a CPU each on
    # a CPU-only machine (whole CPUs for every actor would leave none for the read and decode tasks).
    # Several calls at once feed the actor's one engine stream, so it never drains between calls:
    # a call's rows come back only when its slowest row is done, and the other calls' rows must
    # fill the slots meanwhile (with 2 calls of 256 rows a GPU actor ran at half the engine's rate).
    calls = 6  # driver.py's calls_per_actor for calls of a slots' worth of rows
    pool = ray.data.ActorPoolStrategy(size=2, max_tasks_in_flight_per_actor=calls,
                                      max_concurrent_calls_per_actor=calls, enable_true_multi_threading=True)
    ds = ds.map_batches(Transcribe, fn_constructor_kwargs={"model": "tiny.en"}, batch_size=rows, compute=pool,
                        num_gpus=gpus, num_cpus=1 if gpus else 0.5)
    for row in ds.iter_rows():  # id, text, error (None when ok), record (the verbose_json record)
        record = json.loads(row["record"])
        print(row["id"], record["duration"], row["text"] if row["error"] is None else row["error"])

    # or ds.write_parquet("transcripts/"): `record` is JSON text, `text` and `error` plain columns

`Transcribe` also takes the rows undecoded (an `audio` column), decoding them in the actor.
Writing with `ds.write_*` is at-least-once (a retried task may write its rows again); for exactly
once per id into a folder that resumes, use `batchscribe run --ray`.
"""

from __future__ import annotations

from batchscribe.ray.actor import Transcribe, decode_batch

__all__ = ["Transcribe", "decode_batch"]
