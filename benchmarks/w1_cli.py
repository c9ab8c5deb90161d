"""W1-CLI: `batchscribe run` as a user runs it (one process, default options, started cold) on W1's
rows replicated to 5,000 (16.7 h), against transformers' ASR pipeline on the same rows.

    python benchmarks/w1_cli.py --parquet FIRST100.parquet [--replicate 50] [--peer-rows 500]

Reports, from summary.json and the wall clock around the process:
- start-up: a 3-row run, process start to exit;
- the 5,000-row run twice (the first fills the on-disk kernel caches a user's later runs reuse):
  RTFx including and excluding model load;
- the same rows through `batchscribe.run.run` in this process, with the engine's host seconds by
  stage and its timeline (where the time goes beyond the warmed W1 benchmark);
- the peer: transformers' pipeline (fp16, batch 256, timestamps) on the first --peer-rows rows,
  decoding the same FLAC bytes with soundfile inside the timed region.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from w1_tiny import replicate, wer

REPO = Path(__file__).resolve().parents[1]


def cli_run(data: Path, out: Path, *extra: str, limit: int | None = None, profile: Path | None = None,
            tree: Path = REPO) -> dict:
    """`python -m batchscribe run DATA -o OUT` in a fresh process; summary.json plus the wall time.
    With `profile`, under `-X importtime` and cProfile (main thread): profile/cli.prof and
    profile/importtime.txt. `tree`: the checkout whose batchscribe runs (--before's)."""
    python = [sys.executable]
    if profile is not None:
        python += ["-X", "importtime", "-m", "cProfile", "-o", str(profile / "cli.prof")]
    cmd = [*python, "-m", "batchscribe", "run", str(data), "-o", str(out), *extra]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    if profile is not None:
        (profile / "importtime.txt").write_text(done.stderr)
    summary = json.loads(next(out.glob("summary*.json")).read_text())
    return {"wall": wall, "summary": summary}


def hyps_of(out: Path) -> dict[str, str]:
    hyps = {}
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            hyps[rec["id"]] = rec.get("text", "")
    return hyps


def in_process(data: Path, out: Path) -> dict:
    """run() here, keeping the transcriber: the scheduler's stage seconds and timeline."""
    from batchscribe.run import RunOptions, default_transcriber, run

    kept = {}

    def factory(opts: RunOptions):
        kept["t"] = default_transcriber(opts)
        return kept["t"]

    t0 = time.perf_counter()
    result = run([str(data)], out, RunOptions(), transcriber_factory=factory)
    wall = time.perf_counter() - t0
    sched = kept["t"].scheduler()
    start = sched.marks.get("start", t0)
    return {"wall": wall, "summary": result.summary, "model_load": round(result.summary["model_load_seconds"], 3),
            "stages": {k: round(v, 3) for k, v in sched.timings.items()},
            "engine": {k: round(v, 3) for k, v in sched.engine.timings.items()},
            "timeline": {k: round(v - start, 3) for k, v in sched.marks.items()},
            "start_after_launch": round(start - t0, 3)}  # fmt: skip


def print_profile(profile: Path, wall: float) -> None:
    """The cold run's main thread by cumulative time, and the slowest top-level imports."""
    import pstats

    print(f"profiled cold run: {wall:.2f} s wall (cProfile and -X importtime slow it)")
    pstats.Stats(str(profile / "cli.prof")).sort_stats("cumulative").print_stats(45)
    imports = []
    for line in (profile / "importtime.txt").read_text().splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit() and not name.startswith("  "):  # top level only
                imports.append((int(cumulative) / 1e6, name.strip()))
    print("slowest top-level imports (s):", ", ".join(f"{n} {t:.2f}" for t, n in sorted(imports)[::-1][:15]))


def ab(data: Path, tmp: Path, before: Path, rounds: int, audio_s: float) -> None:
    """Cold runs of the whole set, alternated between `before` and this checkout, same machine."""
    trees = [("before " + (before / "COMMIT").read_text().strip(), before.resolve()), ("after", REPO)]
    for r in range(rounds):
        for label, tree in trees:
            out = tmp / f"ab_{r}_{label.split()[0]}"
            x = cli_run(data, out, tree=tree)
            s = x["summary"]
            print(f"ab round {r + 1} {label}: wall {x['wall']:.2f} s (RTFx {audio_s / x['wall']:.0f}), run() "
                  f"{s['wall_seconds']:.2f} s, summary RTFx {s['rtfx']:.0f}, excluding model load "
                  f"{s['rtfx_excluding_model_load']:.0f}, model load {s['model_load_seconds']:.2f} s", flush=True)  # fmt: skip
            shutil.rmtree(out)


def peer(data: Path, folder: str, rows: int, batch: int) -> dict:
    import pyarrow.parquet as pq
    import soundfile as sf
    import torch
    import transformers

    pipe = transformers.pipeline("automatic-speech-recognition", model=folder, device=0, dtype=torch.float16)
    table = pq.read_table(data, columns=["id", "audio"]).slice(0, rows)
    ids, blobs = table.column("id").to_pylist(), [a["bytes"] for a in table.column("audio").to_pylist()]

    def go(n: int) -> dict[str, str]:
        audio = [{"raw": sf.read(io.BytesIO(b), dtype="float32")[0], "sampling_rate": 16000} for b in blobs[:n]]
        outs = pipe(audio, batch_size=batch, return_timestamps=True)
        return {i: o["text"] for i, o in zip(ids, outs)}

    go(min(batch, rows))  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hyps = go(rows)
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "hyps": hyps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, required=True)
    ap.add_argument("--replicate", type=int, default=50)
    ap.add_argument("--peer-rows", type=int, default=500)
    ap.add_argument("--peer-batch", type=int, default=256)
    ap.add_argument("--variants", nargs="*", default=[], help="flag strings for further cold runs, e.g. "
                    "' --no-progress' ' --no-report': where the process's time goes (each with a leading "
                    "space, or argparse reads it as an option of this program)")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--profile", type=Path, default=None, help="also one cold run under cProfile and "
                    "-X importtime, its files written to this folder")
    ap.add_argument("--profile-only", action="store_true", help="with --profile: the start-up run and the "
                    "profiled run only")
    ap.add_argument("--before", type=Path, default=None, help="a tree with an earlier batchscribe/ (stage.sh's "
                    ".before, its commit in COMMIT): first cold runs alternated between it and this checkout")
    ap.add_argument("--rounds", type=int, default=2, help="with --before: alternated rounds")
    ap.add_argument("--ab-only", action="store_true", help="with --before: the alternated runs only")
    args = ap.parse_args()
    import common

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "w1cli.parquet"
        n_items, audio_s, refs = replicate(args.parquet, args.replicate, data)
        seconds_per_row = audio_s / n_items
        if args.before is not None:
            ab(data, tmp, args.before, args.rounds, audio_s)
            if args.ab_only:
                return
        start = cli_run(data, tmp / "start", limit=3)
        print(f"start-up: a 3-row run takes {start['wall']:.2f} s (model load {start['summary']['model_load_seconds']:.2f} s)", flush=True)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            prof = cli_run(data, tmp / "profiled", profile=args.profile)
            print_profile(args.profile, prof["wall"])
            if args.profile_only:
                return
        runs = []
        for k in range(2):
            r = cli_run(data, tmp / f"cli{k}")
            s = r["summary"]
            r["rtfx_wall"] = audio_s / r["wall"]
            r["wer"] = wer(refs, {i.split("~")[0]: t for i, t in hyps_of(tmp / f"cli{k}").items() if i.endswith("~0")})
            print(f"cli run {k + 1}: wall {r['wall']:.2f} s, RTFx {r['rtfx_wall']:.0f} (process wall), summary RTFx {s['rtfx']:.0f}, "
                  f"excluding model load {s['rtfx_excluding_model_load']:.0f}, model load {s['model_load_seconds']:.2f} s, "
                  f"WER {100 * r['wer']:.2f} %", flush=True)  # fmt: skip
            runs.append(r)
        for k, flags in enumerate(args.variants):
            r = cli_run(data, tmp / f"variant{k}", *flags.split())
            s = r["summary"]
            print(f"cli {flags}: wall {r['wall']:.2f} s, RTFx {audio_s / r['wall']:.0f} (process wall), summary RTFx "
                  f"{s['rtfx']:.0f}, run() wall {s['wall_seconds']:.2f} s, model load {s['model_load_seconds']:.2f} s", flush=True)  # fmt: skip
        inside = in_process(data, tmp / "inproc")
        print("in-process run():", json.dumps({k: v for k, v in inside.items() if k != "summary"}), flush=True)
        from batchscribe.weights import resolve_model

        p = peer(data, str(resolve_model("tiny.en")), min(args.peer_rows, n_items), args.peer_batch)
        p_rtfx = seconds_per_row * min(args.peer_rows, n_items) / p["seconds"]
        p_wer = wer(refs, {i.split("~")[0]: t for i, t in p["hyps"].items() if i.endswith("~0")})
        print(f"transformers pipeline fp16 bs {args.peer_batch}: {min(args.peer_rows, n_items)} rows in {p['seconds']:.1f} s, "
              f"RTFx {p_rtfx:.0f}, WER {100 * p_wer:.2f} %", flush=True)  # fmt: skip
    best = runs[-1]
    s = best["summary"]
    print(f"\nW1-CLI tiny.en, {n_items} rows ({audio_s / 3600:.1f} h), {common.hardware()}, commit {common.commit()}")
    if not args.no_append:
        common.append_result({
            "workload": f"W1-CLI tiny.en `batchscribe run` defaults, {n_items} train-clean-5 rows, second cold process",
            "ours": f"RTFx {best['rtfx_wall']:.0f} (process wall); {s['rtfx_excluding_model_load']:.0f} excluding model load",
            "peer": f"transformers pipeline fp16 bs {args.peer_batch} ({min(args.peer_rows, n_items)} rows): RTFx {p_rtfx:.0f}",
            "ratio": f"{best['rtfx_wall'] / p_rtfx:.0f}x", "wer": f"{100 * best['wer']:.2f} / {100 * p_wer:.2f} %",
            "notes": f"3-row start-up {start['wall']:.1f} s; first cold run RTFx {runs[0]['rtfx_wall']:.0f}; model load {s['model_load_seconds']:.1f} s",
        })  # fmt: skip


if __name__ == "__main__":
    main()
