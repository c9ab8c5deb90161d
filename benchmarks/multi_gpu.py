"""batchscribe on N GPUs of one host (issue 22): `batchscribe run --gpus N` and `--ray --ray-workers N`
on W1's rows, replicated so that each GPU gets >= 5,000 rows. A program, not a timed test.

    python benchmarks/multi_gpu.py --gpus 1 2 [--rows 100 --replicate 100] [--kill]

For each N and each path, one cold `batchscribe run` process into a fresh folder (defaults, the real
tiny.en, the local Ray cluster this program starts once with every GPU, as ray_overhead.py does):
throughput (RTFx over summary.json's in-run wall, and the process wall), scaling against the same
path on the smallest N, and the records: exactly one per id (every committed shard counted, so a
duplicate shows), and texts against the smallest N's run of the same path. --kill adds one run of
each path at the largest N with a child (SIGKILL to the pid in its writer lock) or a Ray actor
(SIGKILL to a MapWorker process) killed once records are committed: then, exactly one record per id.
Records (tokens and timestamps) are also compared with the first run's, across paths: with
--run-flags --batch-invariant every run should equal it.
--paths ray --device cpu runs the Ray half on the CPU (to try this program without GPUs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import ray_overhead as ro
from common import commit, hardware

from batchscribe.output.lock import writer_lock_name
from batchscribe.output.resume import output_prefix


def _committed(out: Path) -> Counter[str]:
    """How many times each id was committed, over every writer's shards."""
    found: Counter[str] = Counter()
    for p in sorted(out.glob("records*.jsonl")):
        found.update(json.loads(line)["id"] for line in p.read_text().splitlines() if line.strip())
    return found


def _actor_pids() -> list[int]:
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if b"MapWorker(MapBatches(Transcribe))" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def _killer(out: Path, path: str, n: int, done: threading.Event, said: list[str]) -> None:
    """Once a shard is committed (a shard file appears only then), SIGKILL one child (its writer
    lock names it) or one actor."""
    while not done.is_set() and not any(out.glob("records*.jsonl")):
        time.sleep(0.2)
    if done.is_set():
        said.append("finished before a record was committed: nothing killed")
        return
    if path == "gpus":
        pid = int(json.loads((out / writer_lock_name(output_prefix(n, 0))).read_text())["pid"])  # child 0
    else:
        pid = _actor_pids()[0]
    os.kill(pid, signal.SIGKILL)
    said.append(f"killed pid {pid} after {sum(_committed(out).values())} records")


def _go(path: str, n: int, rows: Path, out: Path, cache: Path, address: str, kill: bool) -> dict:
    extra = ["--gpus", str(n)] if path == "gpus" else ["--ray", address, "--ray-workers", str(n)]
    done, said = threading.Event(), []
    watcher = threading.Thread(target=_killer, args=(out, path, n, done, said)) if kill else None
    if watcher:
        watcher.start()
    try:
        wall, summary = ro._run(rows, out, cache, extra)
    except SystemExit as exc:  # a killed run may fail: the rerun must resume it, losing nothing
        if not kill:
            raise
        said.append(f"the run failed ({str(exc).strip().splitlines()[-1][:160]}); rerun")
        wall, summary = ro._run(rows, out, cache, extra)
    finally:
        done.set()
        if watcher:
            watcher.join()
    counts = _committed(out)
    return {"path": path, "n": n, "wall": wall, "inrun": summary["wall_seconds"],
            "audio_s": summary["audio_hours"] * 3600, "ids": len(counts), "dupes": sum(c - 1 for c in counts.values()),
            "said": "; ".join(said), "records": ro._records(out)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, default=ro.DEFAULT_PARQUET)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--replicate", type=int, default=100, help="copies of the rows, ids made unique")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--paths", nargs="+", choices=["gpus", "ray"], default=["gpus", "ray"])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--kill", action="store_true", help="one more run of each path at the largest N, killed once")
    ap.add_argument("--run-flags", default="", help="flags for every run, given with =: --run-flags=--batch-invariant")
    args = ap.parse_args()
    ro.DEVICE = args.device
    ro.RUN_FLAGS[:] = args.run_flags.split()
    import ray

    results: dict[str, dict] = {}  # run name -> its figures
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = ro._rows(args.parquet, args.rows, folder, args.replicate)
        cache = Path(os.environ.get("BATCHSCRIBE_CACHE") or folder / "cache")
        ro._run(rows, folder / "warm", cache, ["--limit", "1"])  # the model converted once, outside the timing
        address = ""
        if "ray" in args.paths:
            gpus = max(args.gpus) if args.device == "cuda" else 0
            ray.init(num_gpus=gpus, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
            address = ray.get_runtime_context().gcs_address
        runs = [(p, n, False) for p in args.paths for n in args.gpus]
        runs += [(p, max(args.gpus), True) for p in args.paths] if args.kill else []
        for path, n, kill in runs:
            name = f"{path}-{n}{'-killed' if kill else ''}"
            r = results[name] = _go(path, n, rows, folder / name, cache, address, kill)
            print(f"{name}: process {r['wall']:.1f} s, in-run {r['inrun']:.1f} s, {r['ids']} ids, {r['dupes']} duplicates"
                  + (f"; {r['said']}" if r["said"] else ""), flush=True)  # fmt: skip
        _report(args, results)
        if address:
            ray.shutdown()


def _report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    first = next(iter(results.values()))
    audio_s, n_rows = first["audio_s"], args.rows * args.replicate
    print(f"\nhardware: {hardware()}; commit {commit()}; {n_rows} rows ({audio_s:.0f} s of audio)")
    if args.run_flags:
        print(f"every run with {args.run_flags}")
    print("| path | GPUs | process wall s | in-run wall s | RTFx (in-run) | scaling (in-run) | ids | duplicates "
          "| texts vs smallest N | records (tokens, times) vs the first run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        base = results[f"{r['path']}-{min(args.gpus)}"]
        texts = sum(r["records"].get(k, (None,))[0] != v[0] for k, v in base["records"].items())
        records = sum(r["records"].get(k) != v for k, v in first["records"].items())
        print(f"| {name} | {r['n']} | {r['wall']:.1f} | {r['inrun']:.1f} | {audio_s / r['inrun']:.0f} | "
              f"{base['inrun'] / r['inrun']:.2f}x | {r['ids']} of {n_rows} | {r['dupes']} | {texts} differ | "
              f"{records} differ |")


if __name__ == "__main__":
    main()
