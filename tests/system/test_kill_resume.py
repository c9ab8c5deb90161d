"""Exactly-once under SIGKILL and SIGTERM: `batchscribe run` stopped at random moments, resumed, compared.

Each seed runs one output directory through a chain of killed runs (the whole process group is
SIGKILLed, as the OOM killer or a lost machine would) and a final run that completes. The kill
moments are random: after a random number of newly committed shards (0 means during start-up or
model loading) plus a random delay, so kills land before, between and during shard commits.
Between runs the shard size and the decoder pool (in-process or a worker process) change, which a
resume allows. The reference is an uninterrupted run of the same command with the real tiny.en.
A run that completes before its kill moment (a fast machine) ends its chain, which is checked like
a final run, and a new chain starts in a fresh directory: every seed delivers its five kills.

SIGTERM (what timeout, Docker, Slurm and Kubernetes send) and SIGINT stop a run as Ctrl-C does:
exit 143 / 130, what is done committed, summary.json "interrupted", no traceback from the run or
its decoder processes. Two writers (two --shard-index values of one input) write into one folder
at once, each stopped and resumed at random moments.

Checked after every kill: every committed shard parses completely and no id is committed twice.
Checked at the end: exactly one record per input id, texts identical to the reference, no temp
file left, the manifests list exactly the shards on disk, and the summaries count every item.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import soundfile as sf

from tests.system.runs import RUN_TIMEOUT_S, command, committed, kill_group, outcome, shards

# The runs here are stopped with SIGINT and SIGHUP as from a terminal: those must not be ignored.
pytestmark = pytest.mark.usefixtures("stops_not_ignored")
SEEDS = (0, 1, 2, 3)
KILLS_PER_SEED = 5  # 20 stops in all
# Each stop's signal: SIGKILL (a crash, the OOM killer), SIGTERM to the run alone (timeout, docker
# stop) or to its group (Slurm), Ctrl-C to the group.
SIGNALS = ((signal.SIGKILL, True), (signal.SIGKILL, True), (signal.SIGTERM, False), (signal.SIGTERM, True),
           (signal.SIGINT, True))  # fmt: skip
RATE_16K = 16000
_command = command


def _kill_at_random_moment(cmd: list[str], out: Path, rng: random.Random, sig: int = signal.SIGKILL,
                           group: bool = True, prefix: str = "records") -> tuple[bool, int, str]:  # fmt: skip
    """Start `cmd`, wait for 0-2 new shards of `prefix` plus 0-1 s, send `sig` (to the process
    group, or the run's process only). (stopped by it, exit code, stderr); not stopped: it
    finished first."""
    def mine() -> list[Path]:
        return [p for p in shards(out) if p.name.startswith(prefix + "-")] if out.exists() else []

    before = len(mine())
    wait_shards = rng.choice((0, 1, 1, 2))
    delay = rng.uniform(0.0, 1.0)
    log = out.parent / f"{out.name}.{prefix}.stderr"
    with open(log, "wb") as err:  # a file, not a pipe: a full pipe could stall the run
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if len(mine()) >= before + wait_shards:
                break
            time.sleep(0.02)
        time.sleep(delay)
        finished = proc.poll() is not None
        if sig == signal.SIGKILL:
            kill_group(proc)
        else:
            try:
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            except ProcessLookupError:
                pass
            proc.wait(timeout=RUN_TIMEOUT_S)  # a graceful stop: commit, summary, exit
    finally:
        if proc.poll() is None:
            kill_group(proc)
    stderr = log.read_text(errors="replace")
    if finished:
        assert proc.returncode == 0, stderr
    return not finished, proc.returncode, stderr


def _check_complete(out: Path, reference: dict[str, str], prefixes: tuple[str, ...] = ("records",)) -> None:
    records = committed(out)
    assert sorted(r["id"] for r in records) == sorted(reference)  # exactly once
    assert {r["id"]: outcome(r) for r in records} == reference
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    listed, ids, items, errors = [], [], 0, 0
    for prefix in prefixes:
        manifest = "_manifest.ndjson" if prefix == "records" else f"_manifest-{prefix}.ndjson"
        entries = [json.loads(line) for line in (out / manifest).read_text().splitlines()]
        listed += [e["shard"] for e in entries]
        ids += [i for e in entries for i in e["ids"]]
        summary = json.loads((out / ("summary.json" if prefix == "records" else f"summary-{prefix}.json")).read_text())
        assert summary["status"] == "complete"
        items, errors = items + summary["items"], errors + summary["errors"]
    assert sorted(listed) == [p.name for p in shards(out)]
    assert sorted(ids) == sorted(reference)
    assert (items, errors) == (len(reference), 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_stopped_by_any_signal_at_random_moments_then_resume_is_exactly_once(
    seed: int, clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(seed)
    fmt = "parquet" if seed == 3 else "jsonl"
    chain = 0
    out = tmp_path / f"out{chain}"
    kills, segments, progress = 0, 0, []
    signals = {signal.SIGTERM: 0, signal.SIGINT: 0}  # graceful stops inside run()
    started = time.monotonic()
    while kills < KILLS_PER_SEED:
        segments += 1
        assert segments <= 3 * KILLS_PER_SEED, "runs keep finishing before their kill moment"
        cmd = _command(clips, out, model_cache, fmt, rng.choice((1, 2)), rng.choice((0, 0, 1)))
        sig, group = rng.choice(SIGNALS)
        killed, code, stderr = _kill_at_random_moment(cmd, out, rng, sig, group)
        killed = killed and code != 0  # 0: it finished between the last look and the signal
        if killed and sig != signal.SIGKILL and code != -sig:  # -sig: it came before or after run()
            assert code == (143 if sig == signal.SIGTERM else 130), stderr
            assert "Traceback" not in stderr, stderr
            signals[sig] += 1
        done = committed(out)  # after every kill: whole shards only, no id twice
        progress.append(len(done) if killed else "done")
        assert {r["id"] for r in done} <= set(reference)
        for r in done:
            assert outcome(r) == reference[r["id"]], r["id"]
        if killed:
            kills += 1
        else:  # a fast machine finished the input first: check this chain, start another
            _check_complete(out, reference)
            chain += 1
            out = tmp_path / f"out{chain}"
    print(f"seed {seed}: {kills} stops in {time.monotonic() - started:.0f} s ({signals[signal.SIGTERM]} SIGTERM, "
          f"{signals[signal.SIGINT]} SIGINT inside run()); records committed at each stop: {progress}")

    final = subprocess.run(_command(clips, out, model_cache, fmt, 2, 0), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert final.returncode == 0, final.stderr
    _check_complete(out, reference)


def test_kill_during_model_conversion_then_rerun(tiny_en_dir: Path, tmp_path: Path) -> None:
    """SIGKILL on first use, after model.safetensors is written and before the folder is complete."""
    import numpy as np

    clip = tmp_path / "silence.wav"
    sf.write(clip, np.zeros(RATE_16K, np.int16), RATE_16K, subtype="PCM_16")
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ["run", str(clip), "-o", str(out), "--model", "tiny.en", "--cache-dir", str(cache), "--device", "cpu",
            "--workers", "0", "--no-progress", "--no-report"]
    script = (
        "import os, signal, sys\n"
        "from batchscribe.weights import ct2_convert\n"
        "ct2_convert._write_json = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from batchscribe.cli import app\n"
        f"sys.argv = ['batchscribe', *{args!r}]\n"
        "app()\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=RUN_TIMEOUT_S)
    assert killed.returncode == -signal.SIGKILL
    assert not (cache / "converted" / "tiny.en").exists()  # only a hidden temp folder is left
    assert not out.exists() or not list(out.glob("records-*"))
    proc = subprocess.run([sys.executable, "-m", "batchscribe", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in committed(out)] == ["silence"]
    assert not list((cache / "converted").glob(".tiny.en.tmp-*"))  # the killed run's temp is reclaimed
    converted = cache / "converted" / "tiny.en"
    assert (converted / "model.safetensors").stat().st_size == (tiny_en_dir / "model.safetensors").stat().st_size


def _untouched_or_complete(out: Path, before: int, after: int) -> bool:
    """A run stopped by a signal's default action: it had not begun (nothing new, no summary) or
    had already finished (its summary says so)."""
    summary = out / "summary.json"
    if not summary.exists():
        return after == before
    return json.loads(summary.read_text())["status"] == "complete"


# SIGTERM to the run alone (timeout, docker stop) or its group (Slurm), Ctrl-C to the group, and
# SIGHUP to the group (a closed terminal or SSH session): its decode processes ignore it too.
STOPS = ((signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGTERM, True), (signal.SIGHUP, True))


def test_sigterm_and_sigint_commit_then_resume_is_exactly_once(
    clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(7)
    out = tmp_path / "out"
    stopped = 0
    for k, (sig, group) in enumerate(STOPS):
        cmd = command(clips, out, model_cache, "jsonl", rng.choice((1, 2)), 1)  # a decoder process too
        (out / "summary.json").unlink(missing_ok=True)  # so one found below is this run's
        before = len(committed(out))
        interrupted, code, stderr = _kill_at_random_moment(cmd, out, rng, sig, group)
        done = committed(out)
        assert {r["id"]: outcome(r) for r in done}.items() <= reference.items()
        if not interrupted:
            continue
        if code == -sig:  # the signal came outside run(): while Python started up, or once it had finished
            assert _untouched_or_complete(out, before, len(done)), stderr
            continue
        stopped += 1
        assert code == (130 if sig == signal.SIGINT else 128 + sig), stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert "rerun the same command to resume" in stderr
        if (out / "summary.json").exists():  # absent when stopped before the model had loaded
            summary = json.loads((out / "summary.json").read_text())
            assert summary["status"] == "interrupted" and summary["items"] == len(done)
    assert stopped >= 2, "runs kept finishing before their signal"
    final = subprocess.run(command(clips, out, model_cache, "jsonl", 2, 0), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert final.returncode == 0, final.stderr
    _check_complete(out, reference)


def test_two_writers_in_one_folder_stopped_and_resumed(
    clips: Path, model_cache: Path, reference: dict[str, str], tmp_path: Path
) -> None:
    """Shard indices 0 and 1 of one input write into one folder at the same time; each is stopped
    (SIGKILL or SIGTERM) at its own random moments and rerun. Together: every id exactly once."""
    out = tmp_path / "out"
    prefixes = ("records-part00000of00002", "records-part00001of00002")
    rngs = [random.Random(11), random.Random(12)]
    for sig in (signal.SIGKILL, signal.SIGTERM):
        results: list[tuple[bool, int, str]] = []

        def one(index: int) -> None:
            cmd = command(clips, out, model_cache, "jsonl", 1, 0, "--num-shards", "2", "--shard-index", str(index))
            results.append(_kill_at_random_moment(cmd, out, rngs[index], sig, True, prefixes[index]))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for interrupted, code, stderr in results:
            assert "is writing into" not in stderr  # two shard indices never refuse each other
            if interrupted and sig == signal.SIGTERM:
                assert code in (143, -signal.SIGTERM), stderr  # -15: before run() began or after it ended
                assert "Traceback" not in stderr, stderr
        done = committed(out)
        assert {r["id"]: outcome(r) for r in done}.items() <= reference.items()
    finals = [subprocess.Popen(command(clips, out, model_cache, "jsonl", 2, 0, "--num-shards", "2",
                                       "--shard-index", str(i)), stderr=subprocess.PIPE, text=True)
              for i in range(2)]  # fmt: skip
    for proc in finals:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, err
    _check_complete(out, reference, prefixes)
