"""`run --gpus` end to end with real processes and the real tiny.en: the children planned over two
CPU "devices" (the hidden --fleet-devices hook), so the split, the restart after a crash and the
stop on SIGTERM run without CUDA. The reference is a plain run of the same rows (conftest.py).
A GPU test compares `--gpus 1` with the plain run on the lent GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.marks import needs_cuda
from tests.system.runs import RUN_TIMEOUT_S, command, committed, outcome, owner_pid, shards

PREFIXES = ("records-part00000of00002", "records-part00001of00002")
FLEET = ("--fleet-devices", "cpu,cpu")


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:  # a file, not a pipe: a full pipe could stall the run
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _wait_for(condition, proc: subprocess.Popen[bytes], log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not condition():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _check_complete(out: Path, reference: dict[str, str]) -> dict:
    records = committed(out)  # no id twice (asserted inside)
    assert {r["id"]: outcome(r) for r in records} == reference
    listed = [json.loads(line)["shard"] for p in PREFIXES for line in (out / f"_manifest-{p}.ndjson").read_text().splitlines()]
    assert sorted(listed) == [p.name for p in shards(out)]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    summary = json.loads((out / "summary.json").read_text())  # one summary for the whole run
    assert (summary["status"], summary["items"], summary["errors"]) == ("complete", len(reference), 1)
    assert [g["prefix"] for g in summary["gpus"]] == list(PREFIXES)
    assert 0 < summary["first_record_seconds"] <= summary["wall_seconds"]  # a child's first, as the parent saw it
    return summary


def test_two_children_equal_a_plain_run_and_a_killed_child_is_restarted(
    clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    out, log = tmp_path / "out", tmp_path / "run.stderr"
    proc = _start(command(clips, out, model_cache, "jsonl", 2, 0, *FLEET), log)
    try:
        # Child 0 has committed a shard: SIGKILL it (a crash, the OOM killer) mid-run.
        _wait_for(lambda: any(p.name.startswith(PREFIXES[0] + "-") for p in shards(out)), proc, log)
        child = owner_pid(out, PREFIXES[0])
        assert child is not None and child != proc.pid
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = _check_complete(out, reference)
    assert [g["restarts"] for g in summary["gpus"]] in ([1, 0], [0, 0])  # 0: it had finished first
    assert summary["this_run"]["items"] == len(reference)
    # Each child kept its own summary too, and they add up to the run's.
    parts = [json.loads((out / f"summary-{p}.json").read_text()) for p in PREFIXES]
    assert sum(p["items"] for p in parts) == len(reference)
    # The split is part of the folder's identity: another GPU count (or a plain run) is refused.
    for other in (["--fleet-devices", "cpu"], []):
        refused = subprocess.run(command(clips, out, model_cache, "jsonl", 2, 0, *other), capture_output=True,
                                 text=True, timeout=RUN_TIMEOUT_S, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "--num-shards: before 2, now 1" in refused.stderr and "--gpus" in refused.stderr, refused.stderr
    assert {r["id"]: outcome(r) for r in committed(out)} == reference  # nothing changed


def _fleet_under_way(clips: Path, out: Path, model_cache: Path, log: Path) -> tuple[list[str], subprocess.Popen, list]:
    """A two-child run started, once a shard is committed and both children hold their locks:
    (its command, the parent, the children's pids)."""
    cmd = command(clips, out, model_cache, "jsonl", 2, 0, *FLEET)
    proc = _start(cmd, log)
    _wait_for(lambda: len(shards(out)) >= 1 and all(owner_pid(out, p) for p in PREFIXES), proc, log)
    return cmd, proc, [owner_pid(out, p) for p in PREFIXES]


def test_sigterm_to_the_parent_stops_every_child_then_a_rerun_resumes(
    clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    out, log = tmp_path / "out", tmp_path / "run.stderr"
    cmd, proc, children = _fleet_under_way(clips, out, model_cache, log)
    try:
        proc.send_signal(signal.SIGTERM)  # the parent alone, as `timeout` or `docker stop` do
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = log.read_text()
    assert code in (143, 0), stderr  # 0: it finished between the look and the signal
    assert not any(_alive(pid) for pid in children)  # no orphan keeps a writer lock
    done = committed(out)
    assert {r["id"]: outcome(r) for r in done}.items() <= reference.items()
    if code == 143:
        assert "Traceback" not in stderr and "rerun the same command to resume" in stderr, stderr
        assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr
    summary = _check_complete(out, reference)
    assert summary["this_run"]["skipped_completed"] == len(done)


def test_a_killed_parent_takes_its_children_down_and_a_rerun_resumes(
    clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL to the parent alone: the children see their stdin close, commit and stop."""
    out, log = tmp_path / "out", tmp_path / "run.stderr"
    cmd, proc, children = _fleet_under_way(clips, out, model_cache, log)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in children):
        assert time.monotonic() < deadline, "a child outlived its parent"
        time.sleep(0.05)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr
    _check_complete(out, reference)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a host without CUDA")
@pytest.mark.parametrize(("args", "says"), [
    (["--gpus", "all"], "has no CUDA GPU"), (["--gpus", "2"], "has no CUDA GPU"),
    (["--gpus", "1", "--device", "cpu"], "--device cpu does not apply"),
    (["--gpus", "1", "--ray", "local"], "pass one"),
])  # fmt: skip
def test_gpus_usage_errors_without_cuda(args: list[str], says: str, tmp_path: Path) -> None:
    from batchscribe.cli import app

    result = CliRunner().invoke(app, ["run", str(tmp_path), "-o", str(tmp_path / "out"), *args],
                                env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.gpu
@needs_cuda
def test_gpus_one_equals_the_plain_run_on_cuda(clips: Path, model_cache: Path, tmp_path: Path) -> None:
    """One child on GPU 0 (CUDA_VISIBLE_DEVICES) makes exactly the plain run's records."""
    base = [sys.executable, "-m", "batchscribe", "run", str(clips), "--model", "tiny.en", "--cache-dir",
            str(model_cache), "--shard-size", "4", "--no-progress", "--no-report"]  # fmt: skip
    plain = subprocess.run([*base, "-o", str(tmp_path / "plain"), "--device", "cuda"], capture_output=True,
                           text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    fleet = subprocess.run([*base, "-o", str(tmp_path / "gpus"), "--gpus", "1"], capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert fleet.returncode == 0, fleet.stderr

    def records(out: Path) -> list[str]:
        return sorted(json.dumps(r, sort_keys=True) for r in committed(out))

    assert records(tmp_path / "gpus") == records(tmp_path / "plain")
    assert json.loads((tmp_path / "gpus" / "summary.json").read_text())["gpus"][0]["device"] == "cuda:0"


def test_a_usage_error_in_the_children_is_the_runs_and_writes_nothing(clips: Path, model_cache: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "out"
    cmd = command(clips, out, model_cache, "jsonl", 2, 0, *FLEET, "--audio-column", "nope")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env={**os.environ,
                                                                                            "COLUMNS": "400"})
    assert done.returncode == 2, done.stderr
    assert "the --gpus child on cpu" in done.stderr and "no audio column 'nope'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not shards(out) and not (out / "summary.json").exists()
