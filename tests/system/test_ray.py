"""`run --ray` on a real local Ray cluster (2 CPUs) with the real tiny.en, against plain runs of the
same rows: exactly one record per id, equal to the plain run's, after an actor is killed mid-run and
after the driver is. The cluster is started once for the module and shut down after it; each CLI
run joins it by address (a fresh `--ray` local cluster per run would cost seconds each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.marks import needs_cuda
from tests.system.runs import RUN_TIMEOUT_S, command, committed, outcome, shards

ray = pytest.importorskip("ray", reason="the ray extra (pip install 'batchscribe[ray]') is not installed")
ROWS = 40


@pytest.fixture(scope="module")
def cluster() -> str:
    import logging

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024**2, logging_level=logging.WARNING,
             log_to_driver=False)  # fmt: skip
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def rows(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 40 real test-other rows (id, audio, text), as the shared Parquet holds them."""
    import pyarrow.parquet as pq

    src = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    if not src.is_file():
        pytest.skip(f"shared data lacks {src}")
    path = tmp_path_factory.mktemp("ray") / "rows.parquet"
    pq.write_table(pq.read_table(src, columns=["id", "audio", "text"]).slice(0, ROWS), path, row_group_size=64)
    return path


def _records(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in committed(out)}  # committed(): no id twice


def _same(got: object, want: object) -> bool:
    """Field for field; floats to 1e-4 relative: torch's threads differ (the plain run's process
    has the cores, each actor its share), and with them the order of float sums (seen: avg_logprob
    2e-6, no_speech_prob 8e-6 relative). Tokens, text, timestamps and every other field must be equal."""
    if isinstance(want, float) and isinstance(got, float):
        return got == pytest.approx(want, rel=1e-4, abs=1e-9)
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return got == want


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S)


def test_a_cpu_actors_room_is_its_nodes_cpus_over_its_own(cluster: str) -> None:
    """Ray's own view, in a real actor: the 2-CPU cluster holds 4 actors of 0.5 CPU and 8 of 0.25
    (their audio budgets split that many ways); the driver, assigned no CPUs, is one."""
    from batchscribe.ray.actor import cpu_actor_room

    class Probe:
        def room(self) -> int:
            return cpu_actor_room()

    rooms = [ray.get(ray.remote(num_cpus=cpus)(Probe).remote().room.remote()) for cpus in (0.5, 0.25)]
    assert rooms == [4, 8]
    assert cpu_actor_room() == 1


def test_two_actors_over_40_rows_equal_a_plain_run(rows: Path, model_cache: Path, cluster: str,
                                                    tmp_path: Path) -> None:  # fmt: skip
    plain = _run(command(rows, tmp_path / "plain", model_cache, "jsonl", 8, 1)[:-1])  # with its WER report
    assert plain.returncode == 0, plain.stderr
    on_ray = _run([*command(rows, tmp_path / "ray", model_cache, "jsonl", 8, 0)[:-1], "--ray", cluster,
                   "--ray-workers", "2"])  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    got, want = _records(tmp_path / "ray"), _records(tmp_path / "plain")
    assert len(want) == ROWS and got.keys() == want.keys()  # exactly one record per id
    assert [i for i in want if not _same(got[i], want[i])] == []  # every record, field for field
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert (summary["status"], summary["items"], summary["ray"]["workers"]) == ("complete", ROWS, 2)
    assert summary["model_load_seconds"] <= summary["first_record_seconds"] <= summary["wall_seconds"]
    for name in ("summary.json", "eval/report.json"):
        assert (tmp_path / "ray" / name).is_file(), name  # the summary and WER report, as a plain run writes
    wer = [json.loads((tmp_path / run / "eval/report.json").read_text())["corpus"]["wer"] for run in ("ray", "plain")]
    assert wer[0] == wer[1]
    again = _run([*command(rows, tmp_path / "ray", model_cache, "jsonl", 8, 0), "--ray", cluster])
    assert again.returncode == 0 and "nothing left to do" in again.stderr, again.stderr


def test_an_actors_model_error_on_a_cluster_by_address_is_a_usage_error(rows: Path, model_cache: Path, cluster: str,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """On a cluster given by its address the driver leaves the model to the actors (it may exist
    only on the cluster's nodes): an unknown one fails the actors' constructors, and the run says
    so as a plain run does (exit 2, the model named), committing nothing. (Ray Data logs its own
    trace of the actor's death before that.)"""
    cmd = command(rows, tmp_path / "out", model_cache)
    cmd[cmd.index("tiny.en")] = "no-such-model"
    got = _run([*cmd, "--ray", cluster])
    assert got.returncode == 2, got.stderr
    assert "\nerror: no Whisper model found for 'no-such-model'" in got.stderr, got.stderr
    assert "Ray Data failed the run" not in got.stderr
    assert committed(tmp_path / "out") == []


def test_word_timestamps_into_parquet_equal_a_plain_run(clips: Path, model_cache: Path, cluster: str,
                                                         tmp_path: Path) -> None:  # fmt: skip
    """`--ray --word-timestamps --format parquet`: the actors' words reach the Parquet writer as the
    plain run's do (its words column, every field equal), and the error record keeps none."""
    plain = _run([*command(clips, tmp_path / "plain", model_cache, "parquet", 4, 0), "--word-timestamps"])
    assert plain.returncode == 0, plain.stderr
    on_ray = _run([*command(clips, tmp_path / "ray", model_cache, "parquet", 4, 0), "--word-timestamps",
                   "--ray", cluster, "--ray-workers", "2"])  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    got, want = _records(tmp_path / "ray"), _records(tmp_path / "plain")
    assert got.keys() == want.keys() and [i for i in want if not _same(got[i], want[i])] == []
    words = {i: r["words"] for i, r in got.items()}
    failed = [i for i in got if got[i].get("error") is not None]
    assert failed and all(not words[i] for i in failed)  # the corrupt clip's error record
    assert all(words[i] for i in got if i not in failed)  # every transcribed clip has its words
    assert all(w["start"] <= w["end"] for ws in words.values() for w in ws or [])


def test_a_prompt_column_reaches_each_item_as_in_a_plain_run(rows: Path, model_cache: Path, cluster: str,
                                                            tmp_path: Path) -> None:  # fmt: skip
    """`--ray --prompt-column`: each row decodes under its own cell's prompt, record for record as
    the plain run does (tests/engine/test_prompt_column.py checks that one against openai-whisper's
    prompted decode), and the prompts change texts, so they did reach the actors."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(rows).slice(0, 12)
    prompts = ["Glossary: Mr. Mc Gregor, Quilty, Miss Hilbert." if k % 3 else None for k in range(12)]
    prompted = tmp_path / "prompted.parquet"
    pq.write_table(table.append_column("names", pa.array(prompts, pa.string())), prompted)
    args = ("--prompt-column", "names")
    runs = {"plain": command(prompted, tmp_path / "plain", model_cache, "jsonl", 8, 0, *args),
            "ray": [*command(prompted, tmp_path / "ray", model_cache, "jsonl", 8, 0, *args), "--ray", cluster,
                    "--ray-workers", "2"],
            "unprompted": command(prompted, tmp_path / "unprompted", model_cache, "jsonl", 8, 0)}  # fmt: skip
    for name, cmd in runs.items():
        done = _run(cmd)
        assert done.returncode == 0, (name, done.stderr)
    got, want, bare = (_records(tmp_path / name) for name in runs)
    assert got.keys() == want.keys() == set(table["id"].to_pylist())
    assert [i for i in want if not _same(got[i], want[i])] == []
    changed = [i for i, p in zip(table["id"].to_pylist(), prompts) if p and got[i]["text"] != bare[i]["text"]]
    assert changed, "no prompt changed a text: the prompts did not reach the actors"
    config = json.loads((tmp_path / "ray" / "run_config.json").read_text())
    assert config["source_options"]["prompt_column"] == "names"


def _actor_pids() -> list[int]:
    """The transcribing actors' processes (Ray names them by their class in the process title)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"MapBatches(Transcribe)" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _start_and_wait(cmd: list[str], out: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (out.exists() and shards(out)):  # a shard committed: the run is under way
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("victim", ["actor", "driver"])
def test_killed_mid_run_then_rerun_is_exactly_once(victim: str, clips: Path, model_cache: Path,
                                                   reference: dict[str, str], cluster: str,
                                                   tmp_path: Path) -> None:  # fmt: skip
    out, log = tmp_path / "out", tmp_path / "run.stderr"
    cmd = [*command(clips, out, model_cache, "jsonl", 1, 0), "--ray", cluster, "--ray-workers", "2"]
    proc = _start_and_wait(cmd, out, log)
    try:
        if victim == "actor":
            pids = _actor_pids()
            assert pids, "no transcribing actor found"
            os.kill(pids[0], signal.SIGKILL)  # Ray restarts it and redoes its task
        else:
            proc.kill()  # the driver: its job's actors go with it
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = committed(out)  # whole shards only, no id twice
    assert {r["id"]: outcome(r) for r in done}.items() <= reference.items()
    print(f"{victim} killed: the run exited {code} with {len(done)} of {len(reference)} records committed")
    if victim == "actor":
        assert code in (0, 1), log.read_text()  # 1: Ray gave up on the task; the rerun finishes it
    rerun = _run(cmd)
    assert rerun.returncode == 0, rerun.stderr
    records = committed(out)
    assert {r["id"]: outcome(r) for r in records} == reference  # nothing lost, nothing twice
    listed = [json.loads(line)["shard"] for line in (out / "_manifest.ndjson").read_text().splitlines()]
    assert sorted(listed) == [p.name for p in shards(out)]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["items"]) == ("complete", len(reference))


@pytest.mark.gpu
@needs_cuda
def test_one_gpu_actor_equals_the_plain_run(clips: Path, model_cache: Path, cluster: str, tmp_path: Path) -> None:
    """On the lent GPU: `--ray` with one GPU actor makes the plain CUDA run's records."""
    base = [sys.executable, "-m", "batchscribe", "run", str(clips), "-o", str(tmp_path / "x"), "--model", "tiny.en",
            "--cache-dir", str(model_cache), "--shard-size", "4", "--no-progress", "--no-report"]  # fmt: skip
    plain = _run([*base, "--device", "cuda"])
    assert plain.returncode == 0, plain.stderr
    plain_out = tmp_path / "plain"
    (tmp_path / "x").rename(plain_out)
    on_ray = _run([*base, "--device", "cuda", "--ray", cluster, "--ray-workers", "1"])
    assert on_ray.returncode == 0, on_ray.stderr
    got, want = _records(tmp_path / "x"), _records(plain_out)
    assert got.keys() == want.keys() and [i for i in want if not _same(got[i], want[i])] == []


def test_the_documented_example_runs_as_written(clips: Path, model_cache: Path, reference: dict[str, str],
                                                tmp_path: Path) -> None:  # fmt: skip
    """batchscribe.ray's docstring example, run in a fresh process (its own local cluster) on the
    clips: every id once, with the plain run's text or error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import batchscribe.ray

    table = pq.read_table(clips)  # the example reads a `text` column too
    data = tmp_path / "test-clips.parquet"
    pq.write_table(table.append_column("text", pa.array([f"ref {i}" for i in table["id"].to_pylist()])), data)
    doc = batchscribe.ray.__doc__ or ""
    body = doc.split("::\n", 1)[1].split("\n\n    # or ds.write_parquet", 1)[0]
    code = "\n".join(line[4:] for line in body.splitlines()).replace("data/test-*.parquet", str(data))
    code = code.replace("ray.init()", "ray.init(num_cpus=2, include_dashboard=False)")  # a small cluster
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S,
                          env={**os.environ, "BATCHSCRIBE_CACHE": str(model_cache)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split(" ", 2) for line in done.stdout.splitlines() if line.split(" ", 1)[0] in reference]
    assert sorted(i for i, _, _ in lines) == sorted(reference)  # each id once
    got = {i: f"ERROR {text}" if reference[i].startswith("ERROR ") else text for i, _, text in lines}
    assert got == reference
