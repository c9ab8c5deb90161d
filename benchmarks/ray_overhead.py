"""The Ray path's overhead: `batchscribe run --ray --ray-workers 2` against a plain `batchscribe run`
on the same rows, on the CPU (issue 21: <= 10 % at 2 workers). A program, not a timed test.

    python benchmarks/ray_overhead.py [--parquet ROWS.parquet] [--rows 40] [--repeat 2]
    python benchmarks/ray_overhead.py --device cuda --rows 100 --replicate 10   (one GPU, issue 21)

Both runs are fresh processes into fresh folders with the real tiny.en (converted once before
timing). The Ray run joins a local cluster this program starts once (`ray.init(num_cpus=N)`), so
the cluster's own start-up (seconds, once per job on a real cluster) is reported apart and not
charged to each run. Reported: the process wall clock, and the in-run wall (summary.json's
`wall_seconds`: lock to summary, model load included) and the time after the first record
(`first_record_seconds`: the steady rate's, not the start-up's). Overhead = Ray / plain - 1. The plain run
uses its default decode processes; torch's threads are the machine's cores in the plain run and
split between the two actors on Ray. The records are compared too: they must be equal.

With --device cuda (the lent H200), the three one-GPU paths on the same rows: a plain run,
`--gpus 1` (one child process) and `--ray --ray-workers 1` (one GPU actor); issue 21 asks each to
match the plain run's records and throughput within 10 %. --replicate copies the rows (ids made
unique) so a GPU run is long enough to time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import commit, hardware

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PARQUET = REPO.parent / "shared" / "data" / "librispeech" / "test-other-subset-00000-of-00001.parquet"


def _rows(src: Path, n: int, folder: Path, replicate: int = 1) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "rows.parquet"
    table = pq.read_table(src, columns=["id", "audio", "text"]).slice(0, n)
    if replicate > 1:
        ids = table.column("id").to_pylist()
        table = pa.concat_tables([table.set_column(0, "id", pa.array([f"{i}~{k}" for i in ids])) for k in range(replicate)])
    pq.write_table(table, path, row_group_size=64)
    return path


DEVICE = "cpu"  # --device; the runs' --device
RUN_FLAGS: list[str] = []  # --run-flags: given to every run (e.g. --batch-invariant)


def _cmd(rows: Path, out: Path, cache: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "batchscribe", "run", str(rows), "-o", str(out), "--cache-dir", str(cache),
            "--device", DEVICE, "--no-progress", "--no-report", *RUN_FLAGS, *extra]  # fmt: skip


def _run(rows: Path, out: Path, cache: Path, extra: list[str]) -> tuple[float, dict]:
    start = time.monotonic()
    done = subprocess.run(_cmd(rows, out, cache, extra), capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(_cmd(rows, out, cache, extra))} failed:\n{done.stderr[-3000:]}")
    return wall, json.loads((out / "summary.json").read_text())


def _two_processes(rows: Path, out: Path, cache: Path) -> tuple[float, dict]:
    """The same parallelism without Ray: --num-shards 2, both at once, one torch thread each (as Ray
    gives each actor), one decode process each. This isolates what Ray itself costs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    procs = [subprocess.Popen(_cmd(rows, out, cache, ["--num-shards", "2", "--shard-index", str(i), "--workers", "0"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"a --num-shards 2 process failed:\n{proc.stderr.read()[-3000:] if proc.stderr else ''}")
    wall = time.monotonic() - start
    parts = [json.loads(p.read_text()) for p in sorted(out.glob("summary-*.json"))]
    return wall, {"wall_seconds": max(p["wall_seconds"] for p in parts), "audio_hours": sum(p["audio_hours"] for p in parts),
                  "first_record_seconds": min(p["first_record_seconds"] for p in parts)}


def _records(out: Path) -> dict[str, tuple]:
    """id -> (text or error, every segment's tokens and timestamps): floats such as avg_logprob
    differ in the last digits with torch's thread count (tests/system/test_ray.py)."""
    found = {}
    for p in sorted(out.glob("records-*.jsonl")):
        for line in p.read_text().splitlines():
            r = json.loads(line)
            found[r["id"]] = (r.get("text"), r.get("error"),
                              [(s["tokens"], s["start"], s["end"]) for s in r.get("segments") or []])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, default=DEFAULT_PARQUET)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray cluster")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: plain, --gpus 1 and one GPU actor on Ray (the lent H200)")
    ap.add_argument("--replicate", type=int, default=1, help="copies of the rows, ids made unique")
    ap.add_argument("--no-shards", action="store_true", help="CPU: leave out the --num-shards 2 run")
    ap.add_argument("--run-flags", default="", help="flags for every run, given with =: --run-flags=--batch-invariant")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    RUN_FLAGS[:] = args.run_flags.split()
    import ray

    gpu = args.device == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = _rows(args.parquet, args.rows, folder, args.replicate)
        cache = Path(os.environ.get("BATCHSCRIBE_CACHE") or folder / "cache")  # a staged model where one is
        _run(rows, folder / "warm", cache, ["--limit", "1"])  # the model converted once, outside the timing
        t0 = time.monotonic()
        ray.init(num_cpus=args.cpus, num_gpus=1 if gpu else 0, include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)  # fmt: skip
        cluster_s, address = time.monotonic() - t0, ray.get_runtime_context().gcs_address
        runs = _gpu_runs(address) if gpu else _cpu_runs(address)
        if args.no_shards:
            runs.pop("plain x2 (--num-shards 2)", None)
        results = {name: [] for name in runs}
        for k in range(args.repeat):  # alternated, so a noisy neighbour hits all alike
            for i, (name, go) in enumerate(runs.items()):
                results[name].append(go(rows, folder / f"run{i}_{k}", cache))
        found = [_records(folder / f"run{i}_0") for i in range(len(runs))]
        same = _agreement(list(runs), found)
        ray.shutdown()
    _print(args, results, cluster_s, same)


def _agreement(names: list[str], found: list[dict]) -> str:
    """Against the first run: ids missing or extra, and ids whose text or tokens differ (on a GPU,
    fp16 sums over other batch shapes can flip a near-tie token; the ids must still be equal)."""
    base, parts = found[0], []
    for name, other in zip(names[1:], found[1:]):
        ids = "same ids" if other.keys() == base.keys() else f"ids differ ({len(other.keys() ^ base.keys())})"
        texts = sum(other.get(k, (None,))[0] != v[0] for k, v in base.items())
        tokens = sum(other.get(k) != v for k, v in base.items())
        parts.append(f"{name}: {ids}, {texts} texts and {tokens} token sequences differ of {len(base)}")
    return "; ".join(parts)


def _cpu_runs(address: str) -> dict:
    return {"plain": lambda rows, out, cache: _run(rows, out, cache, []),
            "plain x2 (--num-shards 2)": _two_processes,
            "ray": lambda rows, out, cache: _run(rows, out, cache, ["--ray", address, "--ray-workers", "2"])}  # fmt: skip


def _gpu_runs(address: str) -> dict:
    return {"plain": lambda rows, out, cache: _run(rows, out, cache, []),
            "--gpus 1": lambda rows, out, cache: _run(rows, out, cache, ["--gpus", "1"]),
            "ray": lambda rows, out, cache: _run(rows, out, cache, ["--ray", address, "--ray-workers", "1"])}  # fmt: skip


def _steady(summary: dict) -> float:
    """The in-run wall after the first record (summary.json's first_record_seconds, the same measure
    on every path): the steady rate's time, without the start-up each path pays differently (the
    model load in one process, a child's under --gpus, the cluster's actors and first tasks on Ray).
    The first record's own work counts as start-up, a little more of it on Ray, whose records
    come a call (up to the engine's slots of rows) at a time."""
    return summary["wall_seconds"] - summary["first_record_seconds"]


def _print(args: argparse.Namespace, results: dict, cluster_s: float, same: str) -> None:
    best = {name: (min(w for w, _ in runs), min(s["wall_seconds"] for _, s in runs),
                   min(_steady(s) for _, s in runs)) for name, runs in results.items()}  # fmt: skip
    audio_s = results["plain"][0][1]["audio_hours"] * 3600
    print(f"hardware: {hardware()}; commit {commit()}; {args.rows} rows x{args.replicate}, {audio_s:.0f} s of "
          f"audio; best of {args.repeat}; Ray cluster start-up {cluster_s:.1f} s (once, not charged)"
          + (f"; every run with {args.run_flags}" if args.run_flags else ""))
    print("| run | process wall s | in-run wall s | RTFx (in-run) | after the first record s |\n|---|---|---|---|---|")
    for name, (wall, inrun, steady) in best.items():
        print(f"| {name} | {wall:.1f} | {inrun:.1f} | {audio_s / inrun:.1f} | {steady:.1f} |")
    for name, runs in results.items():  # every repeat, in order: the machine is noisy
        print(f"{name}, each run (process / in-run / after the first record s): "
              + ", ".join(f"{w:.1f} / {s['wall_seconds']:.1f} / {_steady(s):.1f}" for w, s in runs))
    for name in [n for n in best if n != "plain"]:
        for base in [b for b in best if b != name and (b == "plain" or name == "ray")]:
            print(f"{name} against {base}: process {best[name][0] / best[base][0] - 1:+.1%}, in-run "
                  f"{best[name][1] / best[base][1] - 1:+.1%} (target <= +10%), after the first record "
                  f"{best[name][2] / best[base][2] - 1:+.1%}")
    print(f"records against {next(iter(results))}: {same}")


if __name__ == "__main__":
    main()
