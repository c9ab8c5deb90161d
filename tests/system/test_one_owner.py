"""One output folder, one owner, through the command line with the real tiny.en (issue 18).

A second run into a folder in use is refused (exit 2) and changes nothing, so the live run
finishes with one record per id. A rerun whose records would differ (new weights, inputs resolved
elsewhere, a run_config.json gone) is refused naming only the keys that differ. Usage errors stop
a run before anything is written. --retry-errors replaces a repaired item's error record, once.
Records are read back with json and pyarrow, not with the package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from tests.system.runs import RUN_TIMEOUT_S, command, committed, outcome, owner_pid, shards

WIDE = {**os.environ, "COLUMNS": "400"}  # rich wraps long messages at the terminal width otherwise
DEMO = Path(__file__).resolve().parents[2] / "batchscribe" / "demo"


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=cwd, env=WIDE)


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=WIDE)


def _wait_until_live(proc: subprocess.Popen[str], out: Path, shards_at_least: int = 0) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while owner_pid(out) != proc.pid or len(shards(out)) < shards_at_least:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)


@contextlib.contextmanager
def _paused(proc: subprocess.Popen[str]) -> Iterator[None]:
    """The live run stopped (SIGSTOP: it keeps its locks) while the body runs, so that a loaded
    machine cannot let it finish before the runs meant to meet it have tried."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def _ours(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock"))


def test_two_identical_runs_at_once_one_is_refused(clips: Path, model_cache: Path, reference: dict[str, str],
                                                   tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "out"
    first = _start(command(clips, out, model_cache, "jsonl", 2, 0))
    _wait_until_live(first, out)
    with _paused(first):
        second = _run(command(clips, out, model_cache, "jsonl", 2, 0))
    assert first.wait(timeout=RUN_TIMEOUT_S) == 0, first.communicate()[1]
    assert second.returncode == 2, second.stderr
    refused = second.stderr
    assert "another batchscribe run (pid" in refused and f"is writing into {out}" in refused
    assert "nothing was changed" in refused and "choose another --output" in refused
    records = committed(out)  # no id twice (asserted inside)
    assert {r["id"]: outcome(r) for r in records} == reference
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["items"], summary["status"]) == (len(reference), "complete")


def test_refused_reruns_against_a_live_run_leave_it_alone(clips: Path, model_cache: Path,
                                                          reference: dict[str, str], tmp_path: Path) -> None:
    """A rerun with other settings, the same settings, or --overwrite while a run is live: each is
    refused before it reads or cleans anything, and the live run completes exactly once."""
    out = tmp_path / "out"
    live = _start(command(clips, out, model_cache, "jsonl", 1, 0))
    _wait_until_live(live, out, shards_at_least=1)
    with _paused(live):
        for extra in ((), ("--temperature", "0"), ("--overwrite",)):
            second = _run(command(clips, out, model_cache, "jsonl", 1, 0, *extra))
            assert second.returncode == 2, second.stderr
            assert f"pid {live.pid}" in second.stderr and "is writing into" in second.stderr, second.stderr
    assert live.wait(timeout=RUN_TIMEOUT_S) == 0, live.communicate()[1]
    assert {r["id"]: outcome(r) for r in committed(out)} == reference


def test_changed_weights_are_refused(clips: Path, tiny_en_dir: Path, model_cache: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_en_dir, model)
    out = tmp_path / "out"
    cmd = [*command(clips, out, model_cache), "--limit", "1"]
    cmd[cmd.index("tiny.en")] = str(model)
    assert _run(cmd).returncode == 0
    weights = load_file(str(model / "model.safetensors"))
    name = next(k for k in sorted(weights) if k.endswith("layer_norm.bias"))
    weights[name] = weights[name] + torch.full_like(weights[name], 1e-3)  # same folder, same names
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    cmd[cmd.index("--limit") + 1] = "2"  # one item left to do: its record would mix with the first
    again = _run(cmd)
    assert again.returncode == 2, again.stderr
    assert "the model's weights (sha256): before" in again.stderr and "--overwrite" in again.stderr
    assert "(the weights changed since)" in again.stderr
    assert "decode_options" not in again.stderr and "inputs" not in again.stderr  # only what differs
    assert len(committed(out)) == 1


def test_relative_glob_from_another_directory_is_another_input(clips: Path, model_cache: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        shutil.copy(clips, d / "clips.parquet")
    out = tmp_path / "out"
    cmd = [*command(Path("*.parquet"), out, model_cache), "--limit", "1"]
    assert _run(cmd, cwd=first).returncode == 0
    moved = _run(cmd, cwd=second)
    assert moved.returncode == 2
    assert f'inputs: before ["{first}/*.parquet"], now ["{second}/*.parquet"]' in moved.stderr, moved.stderr


def test_records_without_run_config_are_refused_unless_overwrite(clips: Path, model_cache: Path,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "out"
    cmd = [*command(clips, out, model_cache), "--limit", "1"]
    assert _run(cmd).returncode == 0
    (out / "run_config.json").unlink()
    refused = _run(cmd)
    assert refused.returncode == 2
    assert "holds records but no run_config.json" in refused.stderr and "--overwrite" in refused.stderr
    assert _run([*cmd, "--overwrite"]).returncode == 0 and (out / "run_config.json").is_file()


@pytest.mark.parametrize(("flags", "words"), [
    (("--language", "de"), ("language 'de' (german) cannot be decoded by an English-only model", "--language")),
    (("--task", "translate"), ("task 'translate' needs a multilingual model", "--task")),
    (("--retry-errors", "--overwrite"), ("--retry-errors has nothing to retry", "pass one")),
])  # fmt: skip
def test_usage_errors_before_anything_is_written(flags: tuple[str, ...], words: tuple[str, ...], clips: Path,
                                                 model_cache: Path, tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "out"
    proc = _run([*command(clips, out, model_cache), *flags])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr
    assert not out.exists() or _ours(out) == []  # no run_config.json, no summary, no records


def test_retry_errors_replaces_a_repaired_item_once(model_cache: Path, tmp_path: Path) -> None:
    good, bad = DEMO / "sense_and_sensibility_01_austen_64kb-0870.flac", tmp_path / "broken.flac"
    bad.write_bytes(b"fLaC" + bytes(300))
    manifest = tmp_path / "in.jsonl"
    rows = [{"id": "good", "path": str(good), "text": "x"}, {"id": "broken", "path": str(bad), "text": "x"}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cmd = command(manifest, out, model_cache)
    assert _run(cmd).returncode == 0
    assert "error" in {r["id"]: r for r in committed(out)}["broken"]
    capped = _run([*cmd, "--max-errors", "0"])  # committed errors already past the limit
    assert capped.returncode == 1 and "rerun with --retry-errors" in capped.stderr, capped.stderr
    audio, rate = sf.read(good)
    sf.write(bad, audio[: 2 * rate], rate, format="FLAC")  # the operator repairs the file
    assert _run(cmd).returncode == 0  # a plain rerun keeps the committed error record
    assert "error" in {r["id"]: r for r in committed(out)}["broken"]
    retried = _run([*cmd, "--retry-errors", "--max-errors", "0"])
    assert retried.returncode == 0, retried.stderr
    records = {r["id"]: r for r in committed(out)}  # each id once (asserted inside)
    assert sorted(records) == ["broken", "good"] and "error" not in records["broken"]
    assert records["broken"]["text"].strip() and records["broken"]["duration"] == pytest.approx(2.0, abs=0.01)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["items"], summary["errors"], summary["this_run"]["retried_errors"]) == (2, 0, 1)
    listed = [i for line in (out / "_manifest.ndjson").read_text().splitlines() for i in json.loads(line)["ids"]]
    assert sorted(listed) == ["broken", "good"]
    report = subprocess.run([sys.executable, "-m", "batchscribe", "eval", str(out), "-o", str(tmp_path / "rep"),
                             "--bootstrap", "0"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert len(json.loads((tmp_path / "rep" / "report.json").read_text())["items"]) == 2


def test_output_inside_a_folder_input_is_not_read_back(model_cache: Path, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    audio, rate = sf.read(DEMO / "sense_and_sensibility_01_austen_64kb-0870.flac")
    sf.write(folder / "clip.flac", audio[: 2 * rate], rate)
    cmd = command(folder, folder / "out", model_cache, "parquet")
    assert _run(cmd).returncode == 0
    again = _run(cmd)  # the Parquet records inside the folder would make it a Parquet input
    assert again.returncode == 0, again.stderr
    assert [r["id"] for r in committed(folder / "out")] == ["clip"]


def test_a_truncated_shard_is_moved_aside_and_redone(clips: Path, model_cache: Path, reference: dict[str, str],
                                                     tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "out"
    cmd = [*command(clips, out, model_cache, "jsonl", 2), "--limit", "6"]  # three shards
    assert _run(cmd).returncode == 0
    first = {r["id"]: outcome(r) for r in committed(out)}
    assert len(first) == 6 and first.items() <= reference.items()
    cut = shards(out)[1]
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])  # a disk that lost the tail of a listed shard
    again = _run(cmd)
    assert again.returncode == 0, again.stderr
    assert f"{cut}: does not parse" in again.stderr and "truncated" in again.stderr, again.stderr
    assert f"moved aside to {cut.name}.bad" in again.stderr
    assert (out / f"{cut.name}.bad").read_bytes() == data[: len(data) // 2]  # kept, not deleted
    assert {r["id"]: outcome(r) for r in committed(out)} == first  # its items redone, once


def test_duplicate_stems_keep_their_ids_when_a_file_is_added(model_cache: Path, tmp_path: Path) -> None:
    """`a.flac` and `a.wav` in one folder; `a.aiff` added later sorts before both. A rerun into the
    same folder goes on (the inputs only grew): each earlier file keeps its id and its record, the
    new one is transcribed under its own, and nothing is transcribed twice."""
    clips = sorted(DEMO.glob("*.flac"))
    folder = tmp_path / "in"
    folder.mkdir()
    for name, src in (("a.flac", clips[0]), ("a.wav", clips[1])):
        audio, rate = sf.read(src)
        sf.write(folder / name, audio[: 2 * rate], rate)
    assert _run(command(folder, tmp_path / "out1", model_cache)).returncode == 0
    audio, rate = sf.read(clips[2])
    sf.write(folder / "a.aiff", audio[: 2 * rate], rate)
    before = {r["id"]: r["text"] for r in committed(tmp_path / "out1")}
    again = _run(command(folder, tmp_path / "out1", model_cache))
    assert again.returncode == 0, again.stderr
    records = committed(tmp_path / "out1")
    after = {r["id"]: r["text"] for r in records}
    assert sorted(before) == ["a.flac", "a.wav"] and sorted(after) == ["a.aiff", "a.flac", "a.wav"]
    assert len(records) == 3  # one record per id
    assert {k: after[k] for k in before} == before  # the same file under the same id
    assert len(set(after.values())) == 3  # three different clips: none transcribed twice
