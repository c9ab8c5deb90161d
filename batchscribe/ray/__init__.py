"""batchscribe on Ray Data: the engine as a callable class for `Dataset.map_batches`.

`batchscribe run INPUT -o OUT --ray [ADDRESS] --ray-workers N` runs this pipeline and commits the
records exactly once into OUT (driver.py, commit.py). In your own Ray Data pipeline, use the stages
directly (actor.py); this module does not import ray itself.

A complete example (a local cluster; on a cluster, `ray.init("auto")` and `num_gpus=1`)::

    import json

    import ray

    from batchscribe.ray import Transcribe, decode_batch

    ray.init()
    ds = ray.data.read_parquet("data/test-*.parquet", columns=["id", "audio", "text"])
    # CPU tasks: encoded audio ({bytes, path} structs, bytes or paths) -> 16 kHz float32 samples
    ds = ds.map_batches(decode_batch, batch_size=16, fn_kwargs={"text_column": "text"})
    # one engine per actor, the model loaded once per actor
    ds = ds.map_batches(Transcribe, fn_constructor_kwargs={"model": "tiny.en", "device": "auto"},
                        batch_size=256, num_gpus=1, concurrency=4)
    for row in ds.iter_rows():  # id, text, error (None when ok), record (the verbose_json record)
        record = json.loads(row["record"])
        print(row["id"], row["text"] if row["error"] is None else row["error"])

    ds.write_parquet("transcripts/")  # or keep the columns you need; `record` is JSON text

`Transcribe` also takes the rows undecoded (an `audio` column), decoding them in the actor.
Writing with `ds.write_*` is at-least-once (a retried task may write its rows again); for exactly
once per id into a folder that resumes, use `batchscribe run --ray`.
"""

from __future__ import annotations

from batchscribe.ray.actor import Transcribe, decode_batch

__all__ = ["Transcribe", "decode_batch"]
