"""evaluate() joins predictions to references; here the references come from the records' own
`reference` field (the full figures are checked in test_wer.py, the files in test_render.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jiwer
import pytest

from batchscribe.eval.report import evaluate
from batchscribe.process_context import alive
from tests.eval.sample_runs import HYPS_B, REFS


def test_references_default_to_the_records_reference_field(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    rows = [{"id": k, "text": HYPS_B[k], "reference": v, "speaker": "s1"} for k, v in REFS.items()]
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = evaluate(out, [], normalizer="none", group_columns=["speaker"], bootstrap=0)
    ids = list(REFS)
    assert report.wer == pytest.approx(jiwer.wer([REFS[i] for i in ids], [HYPS_B[i] for i in ids]))
    assert [r.key for r in report.groups["speaker"]] == ["s1"]


def test_scoring_over_worker_processes_equals_one_process(tmp_path: Path, monkeypatch) -> None:
    """Past PARALLEL_ITEMS the items are scored in worker processes: the same items, in the same
    order, with the same figures as scoring them here; errors and groups survive the slimmed
    records the workers get."""
    from batchscribe.eval import report as report_module

    out = tmp_path / "run"
    out.mkdir()
    rows = []
    for k in range(37):
        for key, ref in REFS.items():
            rec = {"id": f"{key}-{k}", "reference": ref, "speaker": f"s{k % 3}", "duration": 1.0 + k,
                   "segments": [{"tokens": list(range(50))}]}  # fmt: skip
            rec.update({"error": "decode failed"} if k == 5 else {"text": HYPS_B[key]})
            rows.append(rec)
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    here = evaluate(out, [], group_columns=["speaker"], bootstrap=0)
    monkeypatch.setattr(report_module, "PARALLEL_ITEMS", 10)
    monkeypatch.setattr(report_module, "CHUNK_ITEMS", 40)
    monkeypatch.setattr(report_module.os, "cpu_count", lambda: 4)
    spawned = []
    real_pool = report_module.process_pool
    monkeypatch.setattr(report_module, "process_pool", lambda workers, preload: spawned.append(workers) or real_pool(workers, preload))
    pooled = evaluate(out, [], group_columns=["speaker"], bootstrap=0)
    assert spawned == [4]  # min(cpu_count, chunks) workers
    assert pooled.items == here.items and len(here.items) == 185
    assert pooled.wer == here.wer
    assert sum(i.status == "error" for i in pooled.items) == 5
    assert [r.key for r in pooled.groups["speaker"]] == [r.key for r in here.groups["speaker"]]


# A report scoring over worker processes, killed mid-way: the scoring workers (forkserver children).
_SCORING = textwrap.dedent("""
    import multiprocessing, pathlib, sys, threading, time
    from batchscribe.eval import report
    from batchscribe.eval.inputs import Reference

    def print_workers():
        while len(multiprocessing.active_children()) < 2:
            time.sleep(0.05)
        print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)

    report.MAX_WORKERS = 2
    ref = "he hoped there would be stew for dinner turnips and carrots and bruised potatoes " * 8
    todo = [(Reference(f"u{k}", ref), {"text": ref.replace("stew", "stu")}) for k in range(20_000)]  # ~30 s of CPU
    threading.Thread(target=print_workers, daemon=True).start()
    report._score_all(todo, report.EvalSettings((), ()))
    pathlib.Path(sys.argv[1]).write_text("scored")
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver workers: Linux")
def test_scoring_workers_and_their_server_end_when_the_run_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer, `kill -9`) of a run or `eval` while it scores: its scoring workers
    are the forkserver's children and wait for work forever unless they watch the run, as the
    decode workers do (tests/audio/test_worker.py)."""
    scored = tmp_path / "scored"
    proc = subprocess.Popen([sys.executable, "-c", _SCORING, str(scored)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        servers = {_parent(p) for p in workers}
        assert proc.pid not in servers
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    assert not scored.exists()  # killed while its pool was up
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in [*workers, *servers]):
        time.sleep(0.2)
    survivors = [p for p in [*workers, *servers] if alive(p)]
    for pid in survivors:  # not left running by a failure
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
