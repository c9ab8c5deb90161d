"""The Ray stages as plain functions (no cluster): which rows the decode tasks keep, how they name
a bad file, and the --ray path's usage errors. The reference for a decode error is the plain
run's decode pool on the same bytes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from batchscribe.audio.pool import decode_stream
from batchscribe.audio.sources import SourceError, SourceItem, shard_of
from batchscribe.config import ConfigError
from batchscribe.ray.actor import decode_batch


def _flac(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    sf.write(buf, (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="FLAC")
    return buf.getvalue()


BAD = b"fLaC" + bytes(200)


def test_decode_batch_keeps_this_part_drops_committed_and_decodes_as_run_does() -> None:
    ids = [f"utt{k}" for k in range(12)]
    audio = [{"bytes": _flac(0.5), "path": f"{i}.flac"} for i in ids]
    audio[3] = {"bytes": BAD, "path": "bad.flac"}
    batch = {"id": np.array(ids, dtype=object), "audio": np.array(audio, dtype=object),
             "text": np.array([f"ref {i}" for i in ids], dtype=object)}  # fmt: skip
    out = decode_batch(batch, text_column="text", skip=frozenset({"utt0"}), num_shards=2, shard_index=1)
    want = [i for i in ids if i != "utt0" and shard_of(i, 2) == 1]
    assert list(out["id"]) == want
    for k, item_id in enumerate(out["id"]):
        assert out["reference"][k] == f"ref {item_id}"
        if item_id == "utt3":
            (pool,) = list(decode_stream([SourceItem("utt3", BAD, "bad.flac", None)], workers=0))
            assert out["error"][k] == pool.error and out["samples"][k] is None  # the plain run's message
        else:
            samples = np.frombuffer(out["samples"][k], dtype=np.float32)
            # 16 kHz mono FLAC: soundfile's samples, with no resampling (an independent reader)
            expected, _ = sf.read(io.BytesIO(audio[ids.index(item_id)]["bytes"]), dtype="float32")
            np.testing.assert_array_equal(samples, expected)


def test_keep_rows_drops_committed_ids_and_other_parts_without_decoding() -> None:
    """The filter before the rows are cut into calls: what decode_batch keeps (its own skip and
    --num-shards rules), on Arrow rows, the audio untouched."""
    import pyarrow as pa

    from batchscribe.ray.actor import keep_rows

    ids = [f"utt{k}" for k in range(12)]
    table = pa.table({"id": ids, "audio": [{"bytes": bytes([k]), "path": None} for k in range(12)]})
    kept = keep_rows(table, skip=frozenset({"utt0", "utt5"}), num_shards=2, shard_index=1)
    batch = {"id": np.array(ids, dtype=object), "audio": np.array(table["audio"].to_pylist(), dtype=object)}
    decoded = decode_batch(batch, skip=frozenset({"utt0", "utt5"}), num_shards=2, shard_index=1)
    assert kept["id"].to_pylist() == list(decoded["id"]) == [i for i in ids if i not in ("utt0", "utt5")
                                                               and shard_of(i, 2) == 1]  # fmt: skip
    assert kept["audio"].to_pylist() == [a for i, a in zip(ids, table["audio"].to_pylist()) if i in kept["id"].to_pylist()]
    assert keep_rows(table) is table  # nothing to drop: the same rows


def test_decode_batch_reads_every_cell_form_as_the_plain_runs_sources(tmp_path: Path) -> None:
    """Decoded arrays (`datasets` with Audio decoding on), paths relative to the input's folder and
    raw bytes: the samples the plain run's Parquet source and decode pool give for the same rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchscribe.audio.sources import SourceOptions, iter_source

    rate = 16000
    tone = (0.1 * np.sin(2 * np.pi * 440 * np.arange(rate // 2) / rate)).astype(np.float32)
    (tmp_path / "clip.flac").write_bytes(_flac(0.25))
    cells = [{"array": tone.tolist(), "sampling_rate": rate, "path": None, "bytes": None},
             {"bytes": None, "path": "clip.flac", "array": None, "sampling_rate": None},
             {"bytes": _flac(0.5), "path": None, "array": None, "sampling_rate": None}]  # fmt: skip
    ids = ["array", "relative", "bytes"]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ids, "audio": cells}), parquet)
    plain = {d.id: d for d in decode_stream(iter_source([str(parquet)], SourceOptions()), workers=0)}
    batch = {"id": np.array(ids, dtype=object), "audio": np.array(cells, dtype=object)}
    out = decode_batch(batch, base_dir=str(tmp_path))
    for k, item_id in enumerate(out["id"]):
        assert out["error"][k] is None and plain[item_id].error is None, (out["error"][k], plain[item_id].error)
        np.testing.assert_array_equal(np.frombuffer(out["samples"][k], dtype=np.float32), plain[item_id].audio)
    np.testing.assert_allclose(np.frombuffer(out["samples"][0], dtype=np.float32), tone, atol=1e-7)


def test_decode_batch_carries_each_rows_prompt_as_the_plain_runs_sources_read_it(tmp_path: Path) -> None:
    """--prompt-column through the decode tasks: each row's prompt is the one a plain run's Parquet
    source gives that item (null, empty and blank cells: none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchscribe.audio.sources import SourceOptions, iter_source

    ids = ["named", "null", "empty", "blank"]
    names = ["  Elinor, Marianne Dashwood.  ", None, "", "   "]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ids, "audio": [{"bytes": _flac(0.2), "path": None}] * 4, "names": names}), parquet)
    plain = {i.id: i.prompt for i in iter_source([str(parquet)], SourceOptions(prompt_column="names"))}
    batch = {c: np.array(v, dtype=object) for c, v in pq.read_table(parquet).to_pydict().items()}
    out = decode_batch(batch, prompt_column="names")
    assert dict(zip(out["id"], out["prompt"])) == plain == {"named": "Elinor, Marianne Dashwood.", "null": None,
                                                             "empty": None, "blank": None}  # fmt: skip
    assert list(decode_batch(batch)["prompt"]) == [None] * 4  # no prompt column: no prompts
    with pytest.raises(SourceError, match="no column 'glossary'"):
        decode_batch(batch, prompt_column="glossary")


def test_import_batchscribe_ray_does_not_import_ray() -> None:
    code = "import sys, batchscribe.ray, batchscribe.ray.driver; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_missing_ray_is_a_usage_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from batchscribe.ray.driver import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'batchscribe\[ray\]'"):
        import_ray()


def test_ray_refuses_inputs_it_cannot_read_before_anything_is_written(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from batchscribe.cli import app

    (tmp_path / "a.flac").write_bytes(_flac(0.2))
    runner = CliRunner()
    cases = [(["run", str(tmp_path / "a.flac"), "--ray", "local"], "--ray reads Parquet inputs"),
             (["run", str(tmp_path), "--ray", "local", "--limit", "3"], "--limit"),
             (["run", str(tmp_path), "--ray-workers", "2"], "add --ray")]  # fmt: skip
    for args, says in cases:
        result = runner.invoke(app, [*args, "-o", str(tmp_path / "out")], env={"COLUMNS": "300"})
        assert result.exit_code == 2 and says in result.output, result.output
        assert not (tmp_path / "out").exists()


def test_decode_batch_names_a_missing_column() -> None:
    from batchscribe.audio.sources import SourceError

    batch = {"id": np.array(["a"], dtype=object), "audio": np.array([_flac(0.1)], dtype=object)}
    with pytest.raises(SourceError, match=r"no column 'text'.*columns: id, audio.*text_column="):
        decode_batch(batch, text_column="text")


def test_ray_refuses_repeated_ids_naming_them_before_anything_is_written(tmp_path: Path) -> None:
    """The driver drops an id it has seen (a task Ray redid): a genuinely repeated id would lose an
    item, so such an input is refused up front, across files, and a plain run takes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from batchscribe.cli import app

    audio = {"bytes": _flac(0.2), "path": None}
    pq.write_table(pa.table({"id": ["a", "b"], "audio": [audio, audio]}), tmp_path / "one.parquet")
    pq.write_table(pa.table({"id": ["c", "a"], "audio": [audio, audio]}), tmp_path / "two.parquet")
    result = CliRunner().invoke(app, ["run", str(tmp_path), "--ray", "local", "-o", str(tmp_path / "out")],
                                env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "repeats 1 id(s) ('a')" in result.output and "without --ray" in result.output
    assert not (tmp_path / "out").exists()


def test_a_cpu_actor_decodes_raw_rows_as_the_decode_tasks_do(tiny_en_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the pipeline has no decode tasks: the actor gets the raw rows and `read=` (the
    run's columns). Its records must equal those of the same rows decoded first by decode_batch,
    the GPU path's CPU stage: the reference text, passthrough columns and a bad file's error too."""
    from batchscribe.config import EngineOptions
    from batchscribe.ray.actor import Transcribe

    read = {"id_column": "key", "audio_column": "sound", "text_column": "text", "passthrough": ["speaker"],
            "prompt_column": None, "base_dir": None}  # fmt: skip
    raw = {"key": np.array(["a", "bad", "c"], dtype=object),
           "sound": np.array([{"bytes": _flac(0.6), "path": None}, {"bytes": BAD, "path": None},
                              {"bytes": _flac(1.1), "path": None}], dtype=object),
           "text": np.array(["one", "two", "three"], dtype=object), "speaker": np.array([7, 8, 9])}  # fmt: skip
    from batchscribe.engine import sizing

    monkeypatch.setattr(sizing, "gpus_on_this_machine", lambda: 4)  # a GPU node's, which a CPU actor ignores
    actor = Transcribe(str(tiny_en_dir), engine=EngineOptions(device="cpu", batch_size=4), read=read)
    got, want = actor(raw), actor(decode_batch(raw, **read))
    assert {k: list(v) for k, v in got.items()} == {k: list(v) for k, v in want.items()}
    # The same rows as Arrow batches (the driver's batch_format="pyarrow"), raw and decoded.
    for batch in (raw, decode_batch(raw, **read)):
        arrow = actor(pa.Table.from_pydict({k: list(v) for k, v in batch.items()}))
        assert {k: list(v) for k, v in arrow.items()} == {k: list(v) for k, v in want.items()}
    records = [json.loads(r) for r in got["record"]]
    assert [r["speaker"] for r in records] == [7, 8, 9] and [r.get("reference") for r in records][0] == "one"
    assert got["error"][1] is not None and got["error"][0] is None
    # Outside Ray a CPU actor is alone on its machine: the engine's own default budget, whatever the GPUs.
    assert actor.transcriber.scheduler().engine.config.audio_memory == sizing.host_audio_bytes()


def test_an_actor_hands_the_engine_views_of_arrow_samples_or_copies_in_its_arena(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Decoded rows from Arrow reach the engine without a copy into new bytes objects (Ray's numpy
    batches make one per row, holding the GIL the engine's thread waits for): views of the block.
    With a pinned arena (a GPU engine's host_allocator), each row is copied into it on the call's
    thread, so admission sends it by DMA. The engine here is a stand-in that keeps what it got."""
    import batchscribe.api
    from batchscribe.engine.pinned import PinnedArena
    from batchscribe.ray.actor import Transcribe

    class Engine:
        arena: PinnedArena | None = None

        def __init__(self, **kwargs: object) -> None:
            self.got: dict[str, np.ndarray] = {}

        def describe(self) -> dict[str, object]:
            return {}

        def host_allocator(self) -> object:
            return None if self.arena is None else self.arena.allocate

        def transcribe_stream(self, rows: object) -> object:
            for row in rows:
                if row is not None:
                    self.got[row[0]] = row[1]
                    yield {"id": row[0], "text": f" {row[1].size} samples", "segments": []}

    monkeypatch.setattr(batchscribe.api, "Transcriber", Engine)
    samples = {f"u{k}": np.arange(100 * (k + 1), dtype=np.float32) for k in range(3)}
    table = pa.table({"id": list(samples), "samples": pa.array([a.tobytes() for a in samples.values()], pa.binary()),
                      "error": [None] * 3})  # fmt: skip
    buffer = table.column("samples").chunk(0).buffers()[2]
    for arena in (None, PinnedArena(1 << 16, pin=False)):
        Engine.arena = arena
        actor = Transcribe()
        out = actor(table)
        assert list(out["text"]) == [f" {a.size} samples" for a in samples.values()]
        for item_id, audio in actor.transcriber.got.items():
            np.testing.assert_array_equal(audio, samples[item_id])
            start = audio.__array_interface__["data"][0]
            if arena is None:  # a view of the Arrow block's buffer
                assert buffer.address <= start < buffer.address + buffer.size
            else:
                assert arena.holds(audio)


def test_each_actor_takes_its_share_of_its_machines_audio_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every actor on a node holds decoded audio up to its own budget: by default the machine's,
    split among as many actors as may run there (at most the pool's size; one per GPU; the node's
    CPUs over the actor's for CPU actors, which Ray packs by CPUs). A quarter of the memory each
    would overcommit it with five actors. --audio-memory is taken as given. The engine is a
    stand-in that keeps the options it was built with."""
    import torch

    import batchscribe.api
    import batchscribe.engine.setup
    from batchscribe.config import EngineOptions
    from batchscribe.engine import sizing
    from batchscribe.ray import actor as actor_module

    class Engine:
        def __init__(self, model: str = "", engine: EngineOptions | None = None, **kwargs: object) -> None:
            self.engine_options, self.kwargs = engine, kwargs

        def describe(self) -> dict[str, object]:
            return {}

        def host_allocator(self) -> None:
            return None

    monkeypatch.setattr(batchscribe.api, "Transcriber", Engine)
    monkeypatch.setattr(batchscribe.engine.setup, "resolve_device", lambda name: torch.device(name))
    monkeypatch.setattr(sizing, "host_memory_bytes", lambda: 64 << 30)  # a quarter: 16 GiB
    monkeypatch.setattr(sizing, "gpus_on_this_machine", lambda: 8)
    monkeypatch.setattr(actor_module, "cpu_actor_room", lambda: 4)

    def budget(**kwargs: object) -> int | None:
        return actor_module.Transcribe(**kwargs).transcriber.engine_options.audio_memory

    cpu, gpu = EngineOptions(device="cpu"), EngineOptions(device="cuda")
    assert budget(engine=cpu) == 4 << 30  # four CPU actors fit the node
    assert budget(engine=cpu, peers=2) == 8 << 30  # a pool of two
    assert budget(engine=cpu, peers=16) == 4 << 30
    assert budget(engine=gpu) == 2 << 30  # eight GPUs
    assert budget(engine=gpu, peers=1) == 16 << 30
    assert budget(engine=EngineOptions(device="cpu", audio_memory=5 << 30), peers=2) == 5 << 30
    # Transcriber's engine keywords are the same EngineOptions, split alike.
    keywords = actor_module.Transcribe(device="cpu", batch_size=4, peers=2).transcriber
    assert keywords.engine_options == EngineOptions(device="cpu", batch_size=4, audio_memory=8 << 30)
    assert not {"device", "batch_size"} & set(keywords.kwargs)  # not given twice


def test_ray_on_a_local_cluster_checks_the_model_before_anything_starts(tmp_path: Path, tiny_en_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An unknown model or a language it cannot do is the plain run's usage error with a local
    cluster, before the output folder's lock files (never removed) and before Ray starts (it
    took ~20 s and an actor's traceback to say the same)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    import batchscribe.ray.driver
    from batchscribe.cli import app

    def starts() -> None:
        raise AssertionError("Ray was to start")

    monkeypatch.setattr(batchscribe.ray.driver, "import_ray", starts)
    pq.write_table(pa.table({"id": ["a"], "audio": [{"bytes": _flac(0.2), "path": None}]}), tmp_path / "one.parquet")
    cases = [(["--model", "no-such-model"], "no Whisper model found for 'no-such-model'"),
             (["--model", str(tiny_en_dir), "--language", "de"], "--language")]  # fmt: skip
    for args, says in cases:
        result = CliRunner().invoke(app, ["run", str(tmp_path / "one.parquet"), "--ray", "local", *args, "-o", str(tmp_path / "out")],
                                    env={"COLUMNS": "300"})  # fmt: skip
        assert result.exit_code == 2 and says in result.output, result.output
        assert not (tmp_path / "out").exists()
