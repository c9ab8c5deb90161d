"""The run pipeline: plumbing with a stand-in transcriber (narrow), then the real one end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from batchscribe.audio.sources import SourceOptions
from batchscribe.config import EngineOptions
from batchscribe.engine.pinned import PendingArena
from batchscribe.output.resume import ResumeConflictError
from batchscribe.output.writers import read_shard
from batchscribe.run import RunOptions, RunResult, TooManyErrors, run
from batchscribe.stops import Terminated

DEMO = Path(__file__).resolve().parents[1] / "batchscribe" / "demo"


class FakeTranscriber:
    """Stands in for the model in plumbing tests only: echoes the sample count, out of order."""

    n_slots = 2

    def __init__(self, fail_after: int | None = None, dtype: str = "fake") -> None:
        self.fail_after = fail_after
        self.seen: list[str] = []
        self.dtype = dtype

    def describe(self) -> dict[str, Any]:
        return {"model": {"name": "fake"}, "engine": {"device": "cpu"}, "identity": {"dtype": self.dtype}}

    def host_allocator(self, arena: Any = None) -> None:
        return None

    def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
        batch: list[tuple[str, np.ndarray]] = []
        for item_id, audio in items:
            self.seen.append(item_id)
            batch.append((item_id, audio))
            if len(batch) == 2:
                yield from self._emit(batch[::-1])  # records need not come in input order
                batch = []
        yield from self._emit(batch)

    def _emit(self, batch: list[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
        for item_id, audio in batch:
            if self.fail_after is not None and self.fail_after <= 0:
                raise RuntimeError("simulated crash")
            if self.fail_after is not None:
                self.fail_after -= 1
            yield {"id": item_id, "text": f" n={audio.shape[0]}", "language": "english",
                   "duration": audio.shape[0] / 16000, "segments": []}


def make_manifest(tmp_path: Path, n_copies: int = 2) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Demo clips (copied n times under new ids), one corrupt file, one missing file."""
    rows = [json.loads(line) for line in (DEMO / "manifest.jsonl").read_text().splitlines()]
    out: list[dict[str, Any]] = []
    for k in range(n_copies):
        for r in rows:
            out.append({"id": f"{r['id']}-{k}", "path": str(DEMO / r["path"]), "text": r["text"],
                        "speaker": f"spk{k}"})
    (tmp_path / "corrupt.flac").write_bytes(b"fLaC" + b"\x00" * 300)
    out.append({"id": "corrupt", "path": str(tmp_path / "corrupt.flac"), "text": "x", "speaker": "s"})
    out.append({"id": "missing", "path": str(tmp_path / "nope.wav"), "text": "y", "speaker": "s"})
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in out))
    return manifest, {r["id"]: r for r in out}


def read_all(out: Path) -> list[dict[str, Any]]:
    return [r for p in sorted(out.glob("records-*")) for r in read_shard(p)]


def opts(**kw: Any) -> RunOptions:
    src = SourceOptions(passthrough=("speaker",), **kw.pop("src", {}))
    return RunOptions(source=src, **{"workers": 0, "shard_size": 2, **kw})


def test_plumbing_errors_passthrough_and_summary(tmp_path: Path) -> None:
    manifest, rows = make_manifest(tmp_path)
    fake = FakeTranscriber()
    result = run([str(manifest)], tmp_path / "out", opts(), lambda o: fake)
    records = read_all(tmp_path / "out")
    assert sorted(r["id"] for r in records) == sorted(rows)  # one record per input id
    by_id = {r["id"]: r for r in records}
    for item_id, row in rows.items():
        r = by_id[item_id]
        assert r["reference"] == row["text"] and r["speaker"] == row["speaker"]
        if item_id in ("corrupt", "missing"):
            assert r["error"].startswith(item_id) and r["duration"] is None
            assert item_id not in fake.seen  # decode errors never reach the model
        else:
            frames = sf.info(row["path"]).frames  # independent decode: the 16 kHz demo WAVs
            assert r["text"] == f" n={frames}" and "error" not in r
    s = result.summary
    assert (s["items"], s["ok"], s["errors"]) == (len(rows), len(rows) - 2, 2)
    total_s = sum(sf.info(row["path"]).duration for k, row in rows.items() if k not in ("corrupt", "missing"))
    assert s["audio_hours"] * 3600 == pytest.approx(total_s, rel=1e-6)
    assert s["model"]["info"] == {"name": "fake"} and s["status"] == "complete"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["items"] == len(rows)


@pytest.mark.parametrize("fail_after", [0, 1, 3, 5])
def test_crash_then_resume_is_exactly_once(tmp_path: Path, fail_after: int) -> None:
    manifest, rows = make_manifest(tmp_path, n_copies=3)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run([str(manifest)], out, opts(), lambda o: FakeTranscriber(fail_after=fail_after))
    before = {r["id"] for r in read_all(out)}
    second = FakeTranscriber()
    result = run([str(manifest)], out, opts(), lambda o: second)
    ids = [r["id"] for r in read_all(out)]
    assert sorted(ids) == sorted(rows)  # every id exactly once
    assert not before & set(second.seen)  # committed work is not redone
    assert result.summary["this_run"]["skipped_completed"] == len(before)
    assert result.summary["items"] == len(rows)


def test_a_rerun_with_nothing_left_does_not_load_the_model(tmp_path: Path) -> None:
    manifest, rows = make_manifest(tmp_path, n_copies=2)
    out = tmp_path / "out"
    run([str(manifest)], out, opts(), lambda o: FakeTranscriber())

    def never(o: RunOptions) -> FakeTranscriber:
        raise AssertionError("the model was loaded with nothing left to do")

    result = run([str(manifest)], out, opts(), never)
    assert sorted(r["id"] for r in read_all(out)) == sorted(rows)
    s = result.summary
    assert s["status"] == "complete" and s["this_run"]["nothing_left"] and s["items"] == len(rows)
    assert s["this_run"]["skipped_completed"] == len(rows) and s["model"]["name"] == opts().model
    with pytest.raises(TooManyErrors, match="exceed --max-errors 0.*--retry-errors"):  # the manifest has errors
        run([str(manifest)], out, opts(max_errors=0), never)
    retried = FakeTranscriber()  # --retry-errors has work (the two error records): the model loads
    run([str(manifest)], out, opts(retry_errors=True), lambda o: retried)
    assert sorted(r["id"] for r in read_all(out)) == sorted(rows)


def test_changed_engine_identity_is_refused(tmp_path: Path) -> None:
    """The resolved engine's identity (dtype, kernels) pins a directory as the settings do; a
    directory written before it was recorded resumes."""
    manifest, rows = make_manifest(tmp_path, n_copies=1)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run([str(manifest)], out, opts(), lambda o: FakeTranscriber(fail_after=2))
    assert json.loads((out / "run_config.json").read_text())["engine"] == {"dtype": "fake"}
    with pytest.raises(ResumeConflictError, match="engine"):
        run([str(manifest)], out, opts(), lambda o: FakeTranscriber(dtype="float16"))
    config = json.loads((out / "run_config.json").read_text())
    del config["engine"]  # as an earlier version wrote it
    (out / "run_config.json").write_text(json.dumps(config))
    later = FakeTranscriber(dtype="float16")
    run([str(manifest)], out, opts(), lambda o: later)
    assert sorted(r["id"] for r in read_all(out)) == sorted(rows) and later.seen


def test_changed_model_is_refused_unless_overwrite(tmp_path: Path) -> None:
    manifest, rows = make_manifest(tmp_path, n_copies=1)
    out = tmp_path / "out"
    run([str(manifest)], out, opts(), lambda o: FakeTranscriber())
    with pytest.raises(ResumeConflictError, match="model"):
        run([str(manifest)], out, opts(model="base"), lambda o: FakeTranscriber())
    again = FakeTranscriber()
    run([str(manifest)], out, opts(), lambda o: again)  # same settings: nothing left to do
    assert again.seen == []
    run([str(manifest)], out, opts(model="base", overwrite=True), lambda o: FakeTranscriber())
    assert json.loads((out / "run_config.json").read_text())["model"] == "base"
    assert sorted(r["id"] for r in read_all(out)) == sorted(rows)


def test_max_errors_stops_after_committing(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for i in range(6):
        (bad / f"{i}.wav").write_bytes(b"RIFF0000WAVE")
    with pytest.raises(TooManyErrors, match="--max-errors 2"):
        run([str(bad)], tmp_path / "out", RunOptions(workers=0, max_errors=2, shard_size=100),
            lambda o: FakeTranscriber())
    records = read_all(tmp_path / "out")
    assert len(records) == 3 and all("error" in r for r in records)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "stopped: too many errors" and summary["errors"] == 3


def test_shards_split_the_input_and_limit(tmp_path: Path) -> None:
    manifest, rows = make_manifest(tmp_path, n_copies=3)
    ids: list[str] = []
    for index in range(2):
        run([str(manifest)], tmp_path / "out", opts(src={"num_shards": 2, "shard_index": index}),
            lambda o: FakeTranscriber())
    ids = [r["id"] for r in read_all(tmp_path / "out")]
    assert sorted(ids) == sorted(rows)
    run([str(manifest)], tmp_path / "lim", opts(src={"limit": 4}), lambda o: FakeTranscriber())
    assert [r["id"] for r in read_all(tmp_path / "lim")] != [] and len(read_all(tmp_path / "lim")) == 4


# ------------------------------------------------------------------------------- real model


def _api_available() -> bool:
    try:
        import batchscribe.api  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


needs_api = pytest.mark.skipif(not _api_available(),
                               reason="batchscribe.api (or a module it imports) is not in the tree yet")


@needs_api
def test_demo_end_to_end_real_model(tmp_path: Path, tiny_en_dir: Path) -> None:
    import jiwer
    from openai.types.audio import TranscriptionVerbose

    from batchscribe.eval.normalize import get_normalizer

    result = run([str(DEMO / "manifest.jsonl")], tmp_path / "out",
                 RunOptions(model=str(tiny_en_dir), engine=EngineOptions(device="cpu"), workers=0))
    records = read_all(tmp_path / "out")
    assert len(records) == 3 and result.summary["errors"] == 0
    norm = get_normalizer("english")
    for r in records:
        TranscriptionVerbose.model_validate(r)
        assert r["segments"] and r["segments"][0]["tokens"]
        assert jiwer.wer(norm(r["reference"]), norm(r["text"])) < 0.35, r
    assert result.summary["rtfx"] > 0


def test_a_run_starts_the_gpu_libraries_loading_before_it_reads_the_tokenizer(
        tmp_path: Path, tiny_en_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """run() starts Prewarm (engine/prewarm.py) as soon as the model's shape is known, so on a GPU
    the libraries load while the tokenizer is read; the Ray driver's check_model, in a process
    that never loads the model, starts nothing."""
    from batchscribe.engine import prewarm
    from batchscribe.model.tokenizer import Tokenizer
    from batchscribe.run import check_model

    calls: list[tuple[Any, ...]] = []
    real_start, real_from_folder = prewarm.start, Tokenizer.from_folder.__func__

    def start(options: EngineOptions, dims: Any) -> Any:
        calls.append(("prewarm", options.device, dims.n_audio_state))
        return real_start(options, dims)

    def from_folder(cls: type, *a: Any, **k: Any) -> Any:
        calls.append(("tokenizer",))
        return real_from_folder(cls, *a, **k)

    monkeypatch.setattr(prewarm, "start", start)
    monkeypatch.setattr(Tokenizer, "from_folder", classmethod(from_folder))
    opts = RunOptions(model=str(tiny_en_dir), engine=EngineOptions(device="cpu"), workers=0,
                      source=SourceOptions(limit=1))  # fmt: skip
    files = check_model(opts)
    assert calls == [("tokenizer",)]
    assert files.tokenizer is files.tokenizer and len(calls) == 1  # read once
    calls.clear()
    run([str(DEMO / "manifest.jsonl")], tmp_path / "out", opts)
    assert calls[:2] == [("prewarm", "cpu", 384), ("tokenizer",)]
    assert len(read_all(tmp_path / "out")) == 1


@needs_api
def test_librispeech_parquet_real_model(tmp_path: Path, tiny_en_dir: Path, shared_data: Path) -> None:
    from openai.types.audio import TranscriptionVerbose

    src = shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet"
    run([str(src)], tmp_path / "out", RunOptions(model=str(tiny_en_dir), engine=EngineOptions(device="cpu"),
                                                 format="parquet", workers=1,
                                                 source=SourceOptions(passthrough=("speaker_id",))))
    records = read_all(tmp_path / "out")
    source = {row["id"]: row for row in pq.read_table(src, columns=["id", "text", "speaker_id"]).to_pylist()}
    assert sorted(r["id"] for r in records) == sorted(source)
    for r in records:
        TranscriptionVerbose.model_validate(r)
        row = source[r["id"]]
        assert r["speaker_id"] == row["speaker_id"] and r["reference"] == row["text"]
    shutil.rmtree(tmp_path / "out")


@needs_api
def test_same_transcripts_from_every_input_kind(tmp_path: Path, tiny_en_dir: Path, shared_data: Path) -> None:
    """The same rows as Parquet, save_to_disk, hub-style folder and audio folder: same records."""
    import datasets

    from batchscribe.api import Transcriber

    src = shared_data / "librispeech" / "test-clean-subset-00000-of-00001.parquet"
    rows = pq.read_table(src, columns=["id", "audio", "text"]).to_pylist()
    datasets.Dataset.from_parquet(str(src), cache_dir=str(tmp_path / "cache")).save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "hub" / "data").mkdir(parents=True)
    shutil.copy(src, tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    (tmp_path / "hub" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: test\n    path: data/test-*\n---\n")
    (tmp_path / "folder").mkdir()
    for r in rows:
        (tmp_path / "folder" / f"{r['id']}.flac").write_bytes(r["audio"]["bytes"])

    model = Transcriber(str(tiny_en_dir), device="cpu")  # one real model shared by the four runs
    texts: dict[str, dict[str, str]] = {}
    for kind in ("disk", "hub", "folder"):
        run([str(tmp_path / kind)], tmp_path / f"out-{kind}", RunOptions(workers=0), lambda o: model)
        texts[kind] = {r["id"]: r["text"] for r in read_all(tmp_path / f"out-{kind}")}
    run([str(src)], tmp_path / "out-parquet", RunOptions(workers=0), lambda o: model)
    texts["parquet"] = {r["id"]: r["text"] for r in read_all(tmp_path / "out-parquet")}
    assert sorted(texts["parquet"]) == sorted(r["id"] for r in rows)
    for kind in ("disk", "hub", "folder"):
        assert texts[kind] == texts["parquet"], kind


def test_max_errors_counts_committed_errors_and_retry_errors_replaces_them(tmp_path: Path) -> None:
    """A rerun past --max-errors stops at once and says how to retry; --retry-errors redoes each
    error record once (the repaired item is ok, the still-missing one an error again)."""
    manifest, rows = make_manifest(tmp_path, n_copies=1)
    out = tmp_path / "out"
    run([str(manifest)], out, opts(), lambda o: FakeTranscriber())
    idle = FakeTranscriber()
    with pytest.raises(TooManyErrors, match="exceed --max-errors 1.*rerun with --retry-errors"):
        run([str(manifest)], out, opts(max_errors=1), lambda o: idle)
    assert idle.seen == []
    sf.write(tmp_path / "corrupt.flac", np.zeros(1600, np.float32), 16000, format="FLAC")  # repaired
    again = FakeTranscriber()
    result = run([str(manifest)], out, opts(retry_errors=True), lambda o: again)
    assert again.seen == ["corrupt"]  # "missing" fails in decoding again, before the model
    records = read_all(out)
    assert sorted(r["id"] for r in records) == sorted(rows)  # each id once
    by_id = {r["id"]: r for r in records}
    assert by_id["corrupt"]["text"] == " n=1600" and "error" in by_id["missing"]
    s = result.summary
    assert (s["items"], s["errors"], s["this_run"]["retried_errors"]) == (len(rows), 1, 2)


def test_retry_errors_with_a_limit_keeps_the_error_records_it_does_not_reach(tmp_path: Path) -> None:
    """--retry-errors takes every error record out, but --limit (like a stop) may end the run before
    their items come: those keep their old record, so every id still has exactly one (they were
    deleted, and a rerun with the same --limit said nothing was left to do)."""
    manifest, rows = make_manifest(tmp_path, n_copies=1)  # three clips, then "corrupt" and "missing"
    out = tmp_path / "out"
    run([str(manifest)], out, opts(), lambda o: FakeTranscriber())
    before = {r["id"]: r for r in read_all(out)}
    result = run([str(manifest)], out, opts(retry_errors=True, src={"limit": 3}), lambda o: FakeTranscriber())
    assert {r["id"]: r for r in read_all(out)} == before  # no error item within the limit: nothing redone
    assert (result.summary["items"], result.summary["errors"], result.summary["this_run"]["retried_errors"]) == (5, 2, 0)
    sf.write(tmp_path / "corrupt.flac", np.zeros(1600, np.float32), 16000, format="FLAC")  # repaired
    again = FakeTranscriber()
    result = run([str(manifest)], out, opts(retry_errors=True, src={"limit": 4}), lambda o: again)
    records = read_all(out)
    assert again.seen == ["corrupt"] and sorted(r["id"] for r in records) == sorted(rows)
    by_id = {r["id"]: r for r in records}
    assert by_id["corrupt"]["text"] == " n=1600" and by_id["missing"] == before["missing"]
    assert (result.summary["items"], result.summary["errors"], result.summary["this_run"]["retried_errors"]) == (5, 1, 1)


def test_a_full_disk_at_the_last_commit_still_writes_the_summary(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The last shard is committed after the stream ends; when that commit fails, the summary
    still says what happened (it was not written at all, or an earlier session's stayed), as it
    does for a commit that fails mid-run."""
    from batchscribe.output.writers import ShardWriteError
    from tests.output.faults import full_disk_for_shards

    manifest, rows = make_manifest(tmp_path)
    out = tmp_path / "out"
    full_disk_for_shards(monkeypatch)
    with pytest.raises(ShardWriteError):
        run([str(manifest)], out, opts(shard_size=1000), lambda o: FakeTranscriber())  # one shard, at the end
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items"], summary["this_run"]["items"]) == ("interrupted", 0, len(rows))


def test_progress_knows_a_folders_total(tmp_path: Path) -> None:
    """An audio folder is listed up front (cheap at this size), so the bar shows N/total, not N/?."""
    import shutil

    folder = tmp_path / "clips"
    folder.mkdir()
    for clip in sorted(DEMO.glob("*.flac")):
        shutil.copy(clip, folder / clip.name)
    seen: list = []
    run([str(folder)], tmp_path / "out", RunOptions(workers=0), lambda o: FakeTranscriber(), progress=seen.append)
    n_clips = len(list(DEMO.glob("*.flac")))
    assert seen and {p.total for p in seen} == {n_clips} and seen[-1].done == n_clips


def test_on_cuda_the_engine_build_counts_as_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the engine (slots, graphs, pinned arena) is built by host_allocator(); run() calls it
    inside the start-up it reports, so rtfx_excluding_model_load is the transcribing rate. The
    plan is forced to CUDA's (threads) and the stand-in's engine build takes a known time."""
    import time

    import batchscribe.run as run_module

    class BuildsSlowly(FakeTranscriber):
        def host_allocator(self, arena: Any = None) -> None:
            self.built_at = time.monotonic()
            time.sleep(0.5)
            return None

        def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
            self.streaming_at = time.monotonic()
            yield from super().transcribe_stream(items)

    made: list[BuildsSlowly] = []
    monkeypatch.setattr(run_module._DecodePlan, "for_run", classmethod(lambda cls, opts: cls(True, True, True)))
    monkeypatch.setattr(run_module._DecodePlan, "new_arena", lambda self: PendingArena(1 << 20, pin=False))
    manifest, _ = make_manifest(tmp_path, n_copies=1)
    result = run([str(manifest)], tmp_path / "out", RunOptions(workers=0),
                 transcriber_factory=lambda opts: made.append(BuildsSlowly()) or made[-1])
    assert result.summary["model_load_seconds"] >= 0.5
    assert made[0].seen and made[0].built_at < made[0].streaming_at


def test_importing_the_engine_counts_as_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() imports torch and the engine (1.5-2 s in a cold process) before the model loads, to
    plan the decoding; that is start-up too, or rtfx_excluding_model_load understates the rate by
    those seconds. The plan's imports take a known time here; the stand-in loads at once."""
    import time

    import batchscribe.run as run_module

    plan_for_run = run_module._DecodePlan.for_run

    def slow_imports(cls: type, opts: RunOptions) -> Any:
        time.sleep(0.5)
        return plan_for_run(opts)

    monkeypatch.setattr(run_module._DecodePlan, "for_run", classmethod(slow_imports))
    manifest, _ = make_manifest(tmp_path, n_copies=1)
    s = run([str(manifest)], tmp_path / "out", RunOptions(workers=0), lambda opts: FakeTranscriber()).summary
    assert s["model_load_seconds"] >= 0.5
    audio_seconds = s["this_run"]["audio_hours"] * 3600
    assert s["rtfx_excluding_model_load"] == pytest.approx(audio_seconds / (s["wall_seconds"] - s["model_load_seconds"]),
                                                           rel=0.05)  # fmt: skip


def test_the_summary_says_when_the_first_record_came(tmp_path: Path) -> None:
    """first_record_seconds (every path's one start-up measure: --ray's model_load_seconds is its
    time to the first record) counts from the run's start to the first record, not to a later one
    nor to the end: 0.5 s pass before the first record and 0.5 s more before the second. A rerun
    with nothing left has none."""
    import time

    class SlowFirst(FakeTranscriber):
        def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
            time.sleep(0.5)
            for k, record in enumerate(super().transcribe_stream(items)):
                if k == 1:
                    time.sleep(0.5)
                yield record

    manifest, _ = make_manifest(tmp_path, n_copies=1)
    s = run([str(manifest)], tmp_path / "out", RunOptions(workers=0), lambda opts: SlowFirst()).summary
    assert 0.5 <= s["first_record_seconds"] <= s["wall_seconds"] - 0.5
    again = run([str(manifest)], tmp_path / "out", RunOptions(workers=0), lambda opts: SlowFirst()).summary
    assert again["this_run"].get("nothing_left") and again["first_record_seconds"] is None


def test_decode_threads_decode_into_the_arena_while_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """On CUDA run() makes the pinned arena and starts the decode threads before the model loads,
    then hands the arena to the engine: the load does not wait for audio, nor audio for the load.
    The stand-in's load returns only once samples sit in the arena (it would time out otherwise),
    and the engine is handed that same arena; every item still gets exactly one record."""
    import time

    import batchscribe.run as run_module
    pending = PendingArena(1 << 22, pin=False)  # the ring works unpinned; CUDA only pins it
    arena = pending.result()
    taken: list[Any] = []

    class TakesTheArena(FakeTranscriber):
        def host_allocator(self, arena: Any = None) -> None:
            taken.append(arena)
            return None

    def load(opts: RunOptions) -> TakesTheArena:
        deadline = time.monotonic() + 20
        while arena.in_use() == 0:  # decoded samples, allocated from the arena, not yet transcribed
            assert time.monotonic() < deadline, "nothing was decoded while the model loaded"
            time.sleep(0.01)
        return TakesTheArena()

    monkeypatch.setattr(run_module._DecodePlan, "for_run", classmethod(lambda cls, opts: cls(True, True, True)))
    monkeypatch.setattr(run_module._DecodePlan, "new_arena", lambda self: pending)
    manifest, rows = make_manifest(tmp_path, n_copies=3)
    result = run([str(manifest)], tmp_path / "out", RunOptions(workers=2), transcriber_factory=load)
    assert taken == [arena]
    records = read_all(tmp_path / "out")
    assert sorted(r["id"] for r in records) == sorted(rows)
    assert result.summary["this_run"]["errors"] == 2  # the corrupt and the missing file


def test_a_failed_model_load_stops_the_decoding_it_started(tmp_path: Path) -> None:
    """Decoding starts before the model loads; a load that fails (a usage error, say) ends the
    decode threads too, and the folder keeps nothing of the attempt."""
    import threading

    from batchscribe.config import ConfigError

    def fails(opts: RunOptions) -> FakeTranscriber:
        raise ConfigError("no such model")

    before = {t.name for t in threading.enumerate()}
    manifest, _ = make_manifest(tmp_path, n_copies=2)
    with pytest.raises(ConfigError):
        run([str(manifest)], tmp_path / "out", RunOptions(decode_threads=True, workers=2), transcriber_factory=fails)
    assert not [t for t in threading.enumerate() if t.name not in before and t.is_alive()]
    assert not list((tmp_path / "out").glob("records-*"))


@pytest.mark.parametrize("threads", [False, True], ids=["inline", "decoding-during-the-load"])
@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_stop_during_the_model_load_is_raised_after_it_and_changes_nothing(
        tmp_path: Path, signum: int, raised: type[BaseException], threads: bool) -> None:  # fmt: skip
    """A KeyboardInterrupt inside native code that calls Python (torch's imports, a capture) aborts
    the process, so run() holds a stop that comes while the model loads until the load ends. With
    decode threads, decoding already runs during the load: the stop ends those threads too."""
    import threading

    before = {t.name for t in threading.enumerate()}
    steps: list[str] = []

    def load(o: RunOptions) -> FakeTranscriber:
        signal.raise_signal(signum)
        steps.append("loaded")
        return FakeTranscriber()

    manifest, _ = make_manifest(tmp_path, n_copies=1)
    with pytest.raises(raised) as caught:
        run([str(manifest)], tmp_path / "out", opts(decode_threads=threads, workers=2 if threads else 0), load)
    assert steps == ["loaded"] and (caught.type is Terminated) == (signum == signal.SIGTERM)
    assert not read_all(tmp_path / "out") and not (tmp_path / "out" / "summary.json").exists()
    assert not [t for t in threading.enumerate() if t.name not in before and t.is_alive()]


def test_a_stop_mid_run_shuts_the_decode_processes_down_before_run_returns(tmp_path: Path) -> None:
    """Not when the stream is collected (at exit, after multiprocessing unlinked the pool's
    semaphores, so a worker still starting died printing a traceback)."""
    import multiprocessing

    class StoppedMidRun(FakeTranscriber):
        def transcribe_stream(self, items: Iterable[tuple[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
            for rec in super().transcribe_stream(items):
                yield rec
                raise KeyboardInterrupt  # Ctrl-C while the engine steps

    manifest, _ = make_manifest(tmp_path, n_copies=3)
    with pytest.raises(KeyboardInterrupt) as caught:
        run([str(manifest)], tmp_path / "out", opts(workers=1), lambda o: StoppedMidRun())
    assert caught.value is not None  # the traceback (and the run's frames) still held here
    assert multiprocessing.active_children() == []
    assert len(read_all(tmp_path / "out")) >= 1  # what finished is committed


@pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None, reason="needs pip install 'batchscribe[vad]'")
@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_stop_mid_run_with_vad_commits_and_ends_its_threads_and_the_decode_processes(
        tmp_path: Path, tiny_en_dir: Path, signum: int, raised: type[BaseException]) -> None:  # fmt: skip
    """--vad's stage reads the decoded items on its own thread: a stop still commits what is done,
    and run() returns only after the stage's threads and the decode processes have ended."""
    import multiprocessing
    import threading

    from batchscribe.config import DecodeOptions

    stopped: list[int] = []

    def progress(p: Any) -> None:
        if p.ok and not stopped:  # once: a second signal kills the process, as without batchscribe
            stopped.append(p.ok)
            signal.raise_signal(signum)

    def small_batches(o: RunOptions) -> Any:  # the stage reads a batch ahead: mid-stream at the stop
        from batchscribe.api import Transcriber
        from batchscribe.audio.vad_stream import VadBatching

        t = Transcriber(model=o.model, decode=o.decode, engine=o.engine)
        t.vad_batching = VadBatching(max_items=2)
        return t

    manifest, _ = make_manifest(tmp_path, n_copies=6)
    options = RunOptions(model=str(tiny_en_dir), engine=EngineOptions(device="cpu", batch_size=2), workers=1,
                         decode=DecodeOptions(vad=True, temperatures=(0.0,)), shard_size=1)  # fmt: skip
    with pytest.raises(raised):
        run([str(manifest)], tmp_path / "out", options, small_batches, progress=progress)
    assert multiprocessing.active_children() == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("batchscribe-vad")]
    records = read_all(tmp_path / "out")
    assert stopped and len([r for r in records if r.get("error") is None]) >= 1 and len(records) < 20
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "interrupted"


@pytest.mark.parametrize("language", [None, "en"])
def test_prompt_column_on_a_multilingual_model_needs_a_language(tmp_path: Path, base_dir: Path, language: str | None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """base is multilingual: without --language the run is a usage error before the weights load;
    with one, the run goes on to load them (the stand-in constructor marks that point)."""
    import batchscribe.api
    from batchscribe.config import ConfigError, DecodeOptions

    class Loaded(Exception):
        pass

    def loads(*args: Any, **kwargs: Any) -> None:
        raise Loaded

    monkeypatch.setattr(batchscribe.api, "Transcriber", loads)
    manifest, _ = make_manifest(tmp_path, n_copies=1)
    rows = [{**json.loads(line), "names": "Kenobi"} for line in manifest.read_text().splitlines()]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = opts(model=str(base_dir), decode=DecodeOptions(language=language), src={"prompt_column": "names"})
    expected = pytest.raises(ConfigError, match=r"--prompt-column names with the multilingual model .* needs --language")
    with expected if language is None else pytest.raises(Loaded):
        run([str(manifest)], tmp_path / "out", options)


def test_an_input_error_comes_before_the_output_folder_is_made(tmp_path: Path) -> None:
    """A wrong column (or an empty input) is a usage error; the folder it would have written into
    is not created, nor are its lock files (README: usage errors come before anything is written)."""
    from batchscribe.audio.sources import SourceError

    import pyarrow as pa

    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ["a"], "audio": [b"not read"]}), rows)
    out = tmp_path / "out"
    with pytest.raises(SourceError, match="--audio-column"):
        run([str(rows)], out, RunOptions(workers=0, source=SourceOptions(audio_column="sound")),
            lambda opts: FakeTranscriber())  # fmt: skip
    assert not out.exists()


def test_overwrite_from_one_part_says_it_deletes_the_other_parts_records(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """A folder holds one run's records, so --overwrite from --shard-index 0 deletes part 1's too:
    it says so (it did it silently, found by exploratory QA); a part alone deletes quietly."""
    import logging

    manifest, _ = make_manifest(tmp_path, n_copies=2)
    out = tmp_path / "out"

    def part(k: int, **kw: Any) -> RunResult:
        source = SourceOptions(num_shards=2, shard_index=k)
        return run([str(manifest)], out, RunOptions(workers=0, source=source, **kw), lambda o: FakeTranscriber())

    part(0), part(1)
    with caplog.at_level(logging.WARNING):
        part(0, overwrite=True)
    warned = [r.getMessage() for r in caplog.records if "--overwrite" in r.getMessage()]
    assert len(warned) == 1 and "part00001of00002" in warned[0]
    assert not list(out.glob("[!.]*part00001of00002*"))  # deleted, as said (its lock file stays)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        part(0, overwrite=True)  # only part 0's own files now
    assert not [r for r in caplog.records if "--overwrite" in r.getMessage()]


@pytest.mark.parametrize("model, decode, error", [
    ("no-such-model", {}, "no Whisper model found for 'no-such-model'"),
    ("./models/tiny", {}, "model path './models/tiny' does not exist"),
    ("tiny.en", {"language": "de"}, "cannot be decoded by an English-only model"),
    ("tiny.en", {"task": "translate"}, "task 'translate' needs a multilingual model"),
    ("base", {"language": "xx"}, "language 'xx' is not a Whisper language"),
])  # fmt: skip
def test_a_model_or_language_error_comes_before_the_output_folder_is_made(
        tmp_path: Path, tiny_en_dir: Path, base_dir: Path, model: str, decode: dict[str, str], error: str,
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An unknown model, or a language or task the model cannot do, is a usage error; the folder it
    would have written into is not created, nor are its lock files (which are never removed)."""
    import batchscribe.api
    from batchscribe.config import ConfigError, DecodeOptions
    from batchscribe.weights import ModelNotFoundError

    def loads(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the weights were to load")

    monkeypatch.setattr(batchscribe.api, "Transcriber", loads)
    monkeypatch.chdir(tmp_path)
    model = {"tiny.en": str(tiny_en_dir), "base": str(base_dir)}.get(model, model)
    out = tmp_path / "out"
    raised = ModelNotFoundError if error.startswith(("no Whisper", "model path")) else ConfigError
    with pytest.raises(raised, match=re.escape(error)):
        run([str(DEMO / "manifest.jsonl")], out, RunOptions(model=model, decode=DecodeOptions(**decode), workers=0))
    assert not out.exists()


def test_a_full_disk_names_the_folder_and_loses_nothing_committed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """ENOSPC while committing the second shard: the error names the shard, its folder, the problem
    and the fix; the first shard stays whole and listed, and a rerun (space freed) completes every
    id exactly once without touching it."""
    import errno

    import batchscribe.output.writers as writers
    from batchscribe.output.writers import ShardWriteError

    manifest, rows = make_manifest(tmp_path)
    out = tmp_path / "out"
    real, shards = writers.write_atomic, []

    def full_disk(path: Path, data: bytes, sync_dir: bool = True) -> None:
        if path.name.startswith("records-"):
            shards.append(path.name)
            if len(shards) > 1:  # as write() raises it: no file name
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data, sync_dir)

    monkeypatch.setattr(writers, "write_atomic", full_disk)
    with pytest.raises(ShardWriteError) as err:
        run([str(manifest)], out, opts(), lambda o: FakeTranscriber())
    message = str(err.value)
    assert f"cannot write 2 record(s) to {out / 'records-00001.jsonl'}: No space left on device" in message
    assert f"free space on the disk that holds {out}" in message and "rerun the same command" in message
    first = (out / "records-00000.jsonl").read_bytes()
    assert len(read_all(out)) == 2
    monkeypatch.setattr(writers, "write_atomic", real)
    run([str(manifest)], out, opts(), lambda o: FakeTranscriber())
    assert sorted(r["id"] for r in read_all(out)) == sorted(rows)
    assert (out / "records-00000.jsonl").read_bytes() == first


def test_parts_started_together_with_other_settings_cannot_mix_records(tmp_path: Path) -> None:
    """The parts of an array job into one folder: while part 0 runs (no record committed yet),
    part 1 with another model is refused before its model loads, naming the difference; with the
    same settings it runs beside part 0 (found by QA: both passed and the folder held two models)."""
    import threading

    manifest, rows = make_manifest(tmp_path)
    out, started, go = tmp_path / "out", threading.Event(), threading.Event()

    class Waits(FakeTranscriber):
        def transcribe_stream(self, items):
            started.set()
            go.wait(30)  # live, nothing committed
            yield from super().transcribe_stream(items)

    def part(index: int, model: str, factory) -> RunResult:
        opts = RunOptions(model=model, workers=0, source=SourceOptions(num_shards=2, shard_index=index))
        return run([str(manifest)], out, opts, transcriber_factory=factory)

    first = threading.Thread(target=part, args=(0, "tiny.en", lambda _: Waits()))
    first.start()
    try:
        assert started.wait(30)
        loaded: list[str] = []
        with pytest.raises(ResumeConflictError, match=r'(?s)writing into .*\(shard part00000of00002\).*--model: '
                                                      r'before "tiny.en", now "base"'):  # fmt: skip
            part(1, "base", lambda _: loaded.append("base") or FakeTranscriber())
        assert loaded == []  # refused before the model
        assert part(1, "tiny.en", lambda _: FakeTranscriber()).summary["status"] == "complete"
    finally:
        go.set()
        first.join(60)
    ids = [r["id"] for f in sorted(out.glob("records-*.jsonl")) for r in read_shard(f)]
    assert sorted(ids) == sorted(rows)  # both parts, every id once
