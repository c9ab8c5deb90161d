"""W1: tiny.en on LibriSpeech, from Parquet bytes to written records, against transformers.

    python benchmarks/w1_tiny.py --parquet FIRST100.parquet [--replicate 10] [--model tiny.en] [--peer-batch 256]

FIRST100.parquet: the first 100 rows of ../shared/data/librispeech/train-clean-5-00000-of-00008.parquet
(~13 s utterances, as BENCHMARKS.md measured its peer; `benchmarks/device/stage.sh` writes it). The
test-other subset (7.7 s utterances) weighs per-item host costs more; both are in RESULTS.md.

The Parquet rows are replicated (ids made unique) into a temporary Parquet file so that the run has
>= 1,000 utterances. batchscribe runs its whole `run` pipeline (Parquet reader, decode workers,
engine, JSONL writer); model load, graph capture, the pinned arena and one `run` over 16 rows (a
warm-up, as the peer gets) happen before the clock starts and are reported separately. The peer
decodes the same FLAC bytes with soundfile, extracts features with WhisperFeatureExtractor and runs
transformers' eager `generate` (fp16, timestamps on). WER is over the distinct utterances,
normalised with batchscribe's Whisper English normaliser.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

# Everything heavy (torch, transformers, batchscribe's engine) is imported inside the functions:
# decode worker processes re-run this file's top level as `__mp_main__` (multiprocessing's
# forkserver), so importing torch here would cost each worker ~2 s before its first item. Under
# `batchscribe run` that top level is the CLI's console script, which imports in ~0.2 s.


def replicate(src: Path, times: int, dst: Path) -> tuple[int, float, dict[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src, columns=["id", "audio", "text", "duration_s"])
    parts = []
    for k in range(times):
        ids = pa.array([f"{i}~{k}" for i in table.column("id").to_pylist()])
        parts.append(table.set_column(0, "id", ids))
    whole = pa.concat_tables(parts)
    pq.write_table(whole, dst, row_group_size=64)
    refs = dict(zip(table.column("id").to_pylist(), table.column("text").to_pylist()))
    return whole.num_rows, float(sum(table.column("duration_s").to_pylist())) * times, refs


def wer(refs: dict[str, str], hyps: dict[str, str]) -> float:
    import jiwer

    from batchscribe.eval.normalize import get_normalizer

    norm = get_normalizer("english")
    keys = sorted(refs)
    return jiwer.wer([norm(refs[k]) for k in keys], [norm(hyps[k]) for k in keys])


class _WithPolicy:
    """The transcriber under a scheduling policy other than the default (--ahead, --no-compact)."""

    def __init__(self, transcriber, **changes) -> None:
        from dataclasses import replace

        self.transcriber, self.n_slots = transcriber, transcriber.n_slots
        sched = transcriber.scheduler()
        self.policy = replace(sched.policy, **changes)

    def describe(self) -> dict:
        return self.transcriber.describe()

    def host_allocator(self):
        return self.transcriber.host_allocator()

    def transcribe_stream(self, items):
        return self.transcriber.transcribe_stream(items, policy=self.policy)  # --vad's stage included


_ORIGINAL: dict = {}  # the engine's own chunk sizes and bucket rule, before any override


def _warmed(parquet: Path, model: str, dtype: str | None, slots: int | None, config: str, arena: bool,
            opts, decode_mode: str | None):  # fmt: skip
    """A transcriber whose engine, graphs, arena and `run` path have all run once."""
    import common
    import numpy as np

    from batchscribe.api import Transcriber
    from batchscribe.engine import encoder, engine
    from batchscribe.run import run

    _ORIGINAL.setdefault("chunks", encoder.ENCODER_CHUNKS)
    _ORIGINAL.setdefault("buckets", engine.default_buckets)
    attention, cross_kv, *flags = config.split(":")
    # NOTE: diagnostic-only overrides (read when the engine is built and at each admission), to
    # split --batch-invariant's cost: `enc1` encodes every window alone, `onebucket` steps at all the slots.
    encoder.ENCODER_CHUNKS = (1,) if "enc1" in flags else _ORIGINAL["chunks"]
    engine.default_buckets = (lambda n: [n]) if "onebucket" in flags else _ORIGINAL["buckets"]
    transcriber = Transcriber(model, device="auto", dtype=dtype, batch_size=slots, decode=opts.decode,
                              attention=attention, cross_kv=cross_kv, batch_invariant=common.batch_invariant(flags))  # fmt: skip
    transcriber.transcribe([("warm", np.zeros(16000 * 5, np.float32))], sample_rate=16000)  # builds the engine and its graphs
    if arena and (decode_mode or "threads") == "threads":
        transcriber.host_allocator()  # and its pinned arena (1 GiB page-locked), a start-up cost
    with tempfile.TemporaryDirectory() as warm:
        # The whole `run` path once on 16 rows (as the peer gets a warm-up batch): its first-use
        # imports and library set-up are process start-up, not per-run work.
        import pyarrow.parquet as pq

        pq.write_table(pq.ParquetFile(parquet).read_row_group(0).slice(0, 16), Path(warm) / "warm.parquet")
        run([str(Path(warm) / "warm.parquet")], Path(warm) / "out", opts, transcriber_factory=lambda _: transcriber)
    return transcriber


def ours(parquet: Path, model: str, dtype: str, slots: int | None, workers: int | None, config: str,
         profile_rows: int = 0, decode_mode: str | None = None, ahead: int | None = None,
         arena: bool = True, compact: bool = True, features: dict | None = None) -> dict:  # fmt: skip
    import common
    from batchscribe.config import DecodeOptions
    from batchscribe.run import RunOptions, run

    threads = None if decode_mode is None else decode_mode == "threads"
    decode = DecodeOptions(temperatures=(0.0,), **(features or {}))
    opts = RunOptions(model=model, decode=decode, workers=workers,
                      decode_threads=threads, pinned_arena=arena)  # fmt: skip
    t0 = time.perf_counter()
    transcriber = _warmed(parquet, model, dtype, slots, config, arena, opts, decode_mode)
    load_s = time.perf_counter() - t0
    sched = transcriber.scheduler()
    engine = sched.engine
    capture = engine.graphs.plan.capture_seconds if engine.graphs else 0.0
    capture += engine.encoder_graphs.capture_seconds if engine.encoder_graphs else 0.0
    sched.timings.clear()
    engine.timings.clear()
    changes = {"compact_tail": compact, **({} if ahead is None else {"looks_before_admission": ahead})}
    runner = transcriber if changes == {"compact_tail": True} else _WithPolicy(transcriber, **changes)
    ring = engine.arena  # the pinned arena decode threads write into (None: packed)
    fallbacks = ring.fallbacks if ring is not None else 0
    with tempfile.TemporaryDirectory() as out:
        common.sync()
        t0 = time.perf_counter()
        with _profiled(profile_rows, config), _collections() as gc_seconds:
            run([str(parquet)], Path(out), opts, transcriber_factory=lambda _: runner)
            common.sync()
        seconds = time.perf_counter() - t0
        records = [json.loads(line) for shard in sorted(Path(out).glob("*.jsonl")) for line in shard.read_text().splitlines()]
        hyps = {rec["id"]: rec.get("text", "") for rec in records}
    print(f"{config}: garbage collections in the run (seconds, count) by generation:",
          {g: (round(v[0], 3), v[1]) for g, v in sorted(gc_seconds.items())}, flush=True)  # fmt: skip
    print(f"{config}: engine host seconds by stage:", {k: round(v, 3) for k, v in sched.timings.items()},
          "admission parts:", {k: round(v, 3) for k, v in engine.timings.items()}, flush=True)  # fmt: skip
    # When, from run()'s call: the stream starts, gets its first item, first and last admits,
    # yields its last record; and how many items were decoded into ordinary memory because the
    # pinned ring was full (packed as before).
    print(f"{config}: timeline (s):", {k: round(v - t0, 3) for k, v in sched.marks.items()}, "end", round(seconds, 3),
          "arena fallbacks", "-" if ring is None else ring.fallbacks - fallbacks)  # fmt: skip
    result = {"seconds": seconds, "load_s": load_s, "capture_s": capture, "hyps": hyps, "config": config,
              "slots": transcriber.n_slots, "memory": common.peak_gib(), "attention": transcriber.model_info.attention}
    transcriber.release()  # free this configuration's caches and graphs before the next one
    return result


@contextlib.contextmanager
def _collections():
    """{generation: [seconds, count]} of the cyclic garbage collector's runs inside the block (every
    thread's: a collection stops them all)."""
    import gc

    found: dict[int, list] = {}
    started: list[float] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            entry = found.setdefault(info["generation"], [0.0, 0])
            entry[0] += time.perf_counter() - started.pop()
            entry[1] += 1

    gc.callbacks.append(note)
    try:
        yield found
    finally:
        gc.callbacks.remove(note)


@contextlib.contextmanager
def _profiled(rows: int, config: str):
    """With rows > 0: torch.profiler over the run (host ops of every thread and device kernels),
    printing where host time goes and how long the device was busy. Slows the run; diagnosis only."""
    if rows <= 0:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield
    events = prof.key_averages()
    print(f"\n=== {config}: host ops by self CPU time ===")
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70))
    print(f"\n=== {config}: device kernels by time ===")
    print(events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=70))
    busy = sum(e.self_device_time_total for e in events) / 1e6
    print(f"{config}: device busy {busy:.3f} s (sum of kernel and copy times)", flush=True)


def peer(parquet: Path, folder: str, batch: int) -> dict:
    import pyarrow.parquet as pq
    import soundfile as sf
    import torch
    import transformers

    import common

    model = transformers.WhisperForConditionalGeneration.from_pretrained(folder, dtype=torch.float16).cuda().eval()
    fe = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    tok = transformers.WhisperTokenizerFast.from_pretrained(folder)
    table = pq.read_table(parquet, columns=["id", "audio"])
    ids, blobs = table.column("id").to_pylist(), [a["bytes"] for a in table.column("audio").to_pylist()]

    def go(limit: int | None = None) -> dict[str, str]:
        hyps = {}
        n = len(ids) if limit is None else limit
        for b in range(0, n, batch):
            audio = [sf.read(io.BytesIO(x), dtype="float32")[0] for x in blobs[b : b + batch]]
            feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features.to("cuda", torch.float16)
            with torch.no_grad():
                seqs = model.generate(feats, return_timestamps=True)
            for i, text in zip(ids[b : b + batch], tok.batch_decode(seqs, skip_special_tokens=True)):
                hyps[i] = text
        return hyps

    go(limit=min(batch, len(ids)))  # warm-up
    common.sync()
    t0 = time.perf_counter()
    hyps = go()
    common.sync()
    return {"seconds": time.perf_counter() - t0, "hyps": hyps, "batch": batch}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, required=True)
    ap.add_argument("--replicate", type=int, default=10)
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--decode", choices=["threads", "processes"], default=None,
                    help="decode in threads or processes (default: batchscribe's, threads on a GPU)")
    ap.add_argument("--peer-batch", type=int, nargs="*", default=[256])
    ap.add_argument("--configs", nargs="*", default=["auto:auto"],
                    help="attention:cross_kv pairs to run, e.g. sdpa:auto flashinfer:auto flashinfer:fp8; "
                         "further parts: `invariant` / `variant` run --batch-invariant / --no-batch-invariant "
                         "(auto:auto:variant; neither: the engine's default, invariant on CUDA); `enc1` and "
                         "`onebucket` its two halves alone, with `variant` (diagnostics)")
    ap.add_argument("--in-flight-per-worker", type=int, default=None,
                    help="items handed to each decode worker ahead of their results (diagnosis)")
    ap.add_argument("--thread-chunk", type=int, default=None,
                    help="items per decode-thread task (pool.THREAD_CHUNK_ITEMS; diagnosis)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (seconds; Python's default 0.005)")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="profile each run with torch.profiler and print the top ROWS host ops and kernels")
    ap.add_argument("--ahead", type=int, default=None,
                    help="looks queued before each admission (SchedulePolicy.looks_before_admission; diagnosis)")
    ap.add_argument("--no-compact", action="store_true",
                    help="step the tail's windows where they are (SchedulePolicy.compact_tail=False; diagnosis)")
    ap.add_argument("--packed", action="store_true",
                    help="decode into ordinary memory the engine packs (RunOptions.pinned_arena=False), "
                         "not into its pinned arena (the default with decode threads)")
    ap.add_argument("--vad", action="store_true", help="decode with --vad (Silero, batched ahead of the engine)")
    ap.add_argument("--word-timestamps", action="store_true",
                    help="every configuration with word timestamps (issue 20: their cost on W1)")
    ap.add_argument("--prompt-tokens", type=int, default=0, metavar="N",
                    help="every configuration with an N-token --initial-prompt (issue 20: a prompt's cost)")
    ap.add_argument("--default-gc", action="store_true",
                    help="the default garbage collector during the stream (no batchscribe.heap.stream_collector; diagnosis)")
    ap.add_argument("--align-lengths", type=int, nargs="+", default=None, metavar="TOKENS",
                    help="the alignment pass's token buckets (engine/alignment.py LENGTHS; diagnosis)")
    ap.add_argument("--align-hold", type=int, default=None, metavar="COLLECTS",
                    help="collects a partly filled alignment batch may wait on CUDA (engine/scheduler.py "
                         "ALIGN_HOLD; 0: sent as read, as before; diagnosis)")
    ap.add_argument("--align-lag", type=int, default=None, metavar="COLLECTS",
                    help="collects a queued alignment pass waits beyond the next before being settled "
                         "(engine/scheduler.py ALIGN_LAG; diagnosis)")
    ap.add_argument("--align-batch", type=int, default=None, metavar="WINDOWS",
                    help="windows per alignment pass batch (engine/alignment.py MAX_BATCH; diagnosis)")
    ap.add_argument("--align-stream", action="store_true",
                    help="the alignment pass on a CUDA stream of its own (engine/alignment.py SIDE_STREAM; diagnosis)")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--stall-dump", type=float, default=0, metavar="SECONDS",
                    help="print every thread's stack if the program still runs after SECONDS "
                         "(to see where a run stalls before a time limit kills it)")
    return ap


def _diagnosis(args: argparse.Namespace) -> None:
    """The process-wide knobs the diagnosis flags turn."""
    if args.stall_dump > 0:
        import faulthandler

        faulthandler.dump_traceback_later(args.stall_dump, exit=False)
    if args.default_gc:
        import batchscribe.api

        batchscribe.api.stream_collector = contextlib.nullcontext
    if args.align_lengths:
        from batchscribe.engine import alignment

        alignment.LENGTHS = tuple(args.align_lengths)
    if args.align_batch is not None or args.align_stream:
        from batchscribe.engine import alignment

        alignment.MAX_BATCH = args.align_batch or alignment.MAX_BATCH
        alignment.SIDE_STREAM = args.align_stream
    if args.align_hold is not None:
        from batchscribe.engine import scheduler

        scheduler.ALIGN_HOLD = args.align_hold
    if args.align_lag is not None:
        from batchscribe.engine import scheduler

        scheduler.ALIGN_LAG = args.align_lag
    from batchscribe.audio import pool  # light: the decoders, not torch

    if args.in_flight_per_worker is not None:
        pool.IN_FLIGHT_PER_WORKER = args.in_flight_per_worker
    if args.thread_chunk is not None:
        pool.THREAD_CHUNK_ITEMS = args.thread_chunk
    if args.switch_interval is not None:
        import sys

        sys.setswitchinterval(args.switch_interval)


# Text for --prompt-tokens, unrelated to LibriSpeech's books so that it cannot hand the model its
# references: a prompt's cost is measured, not its help.
_PROMPT_TEXT = ("Minutes of the harbour committee. Present: the chair, the treasurer, two pilots and the "
                "engineer of the northern dredger. The committee reviewed the winter schedule, the price of "
                "diesel, repairs to the east quay, a complaint about night-time noise from the fish market, "
                "and the proposal to rename the lighthouse after its first keeper. ")


def prompt_of(model: str, n: int) -> str | None:
    """An initial prompt of exactly n tokens of the model's tokenizer (None for n = 0)."""
    if n <= 0:
        return None
    from tokenizers import Tokenizer

    from batchscribe.weights import resolve_model

    tok = Tokenizer.from_file(str(Path(resolve_model(model)) / "tokenizer.json"))
    ids = tok.encode(" " + _PROMPT_TEXT * (1 + n // 40), add_special_tokens=False).ids[:n]
    return tok.decode(ids).strip()


def _features(args: argparse.Namespace) -> dict:
    found = {"word_timestamps": True} if args.word_timestamps else {}
    found = {**found, "vad": True} if args.vad else found
    prompt = prompt_of(args.model, args.prompt_tokens)
    return found if prompt is None else {**found, "initial_prompt": prompt}


def _measure(args: argparse.Namespace, data: Path, audio_s: float, refs: dict[str, str]) -> tuple[list, list]:
    import torch

    import common

    results = []
    for config in args.configs:
        r = ours(data, args.model, args.dtype, args.slots, args.workers, config, args.profile, args.decode,
                 args.ahead, not args.packed, not args.no_compact, _features(args))  # fmt: skip
        r["wer"] = wer(refs, {k.split("~")[0]: v for k, v in r["hyps"].items() if k.endswith("~0")})
        # Printed now as well: a peer that runs past a time limit must not take these with it.
        print(f"{config}: {r['seconds']:.2f} s, RTFx {audio_s / r['seconds']:.0f}, WER {100 * r['wer']:.2f} %, "
              f"{r['slots']} slots", flush=True)  # fmt: skip
        results.append(r)
        common.sync()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    peers = []
    if torch.cuda.is_available():
        from batchscribe.weights import resolve_model

        folder = str(resolve_model(args.model))
        for b in args.peer_batch:
            p = peer(data, folder, b)
            p["wer"] = wer(refs, {k.split("~")[0]: v for k, v in p["hyps"].items() if k.endswith("~0")})
            peers.append(p)
    return results, peers


def _report(args: argparse.Namespace, n_items: int, audio_s: float, results: list, peers: list) -> None:
    import common

    extras = ", word timestamps" * args.word_timestamps + (f", {args.prompt_tokens}-token prompt" if args.prompt_tokens else "")
    extras += ", --vad" * args.vad
    print(f"\nW1 {args.model}{extras}, {n_items} utterances ({audio_s / 3600:.2f} h), {common.hardware()}, "
          f"commit {common.commit()}")
    print(f"{'system':<52}{'seconds':>10}{'RTFx':>10}{'WER %':>8}")
    for r in results:
        name = f"batchscribe {r['attention']} ({r['slots']} slots)"
        print(f"{name:<52}{r['seconds']:>10.2f}{audio_s / r['seconds']:>10.0f}{100 * r['wer']:>8.2f}")
    for p in peers:
        print(f"{'transformers bs ' + str(p['batch']):<52}{p['seconds']:>10.2f}{audio_s / p['seconds']:>10.0f}{100 * p['wer']:>8.2f}")
    for r in results:
        print(f"{r['attention']}: model load + capture {r['load_s']:.1f} s (capture {r['capture_s']:.1f} s), peak {r['memory']}")
    if not peers or args.no_append:
        return
    best = max(peers, key=lambda p: audio_s / p["seconds"])
    for r in results:
        ratio = best["seconds"] / r["seconds"]
        print(f"{r['attention']}: ratio vs best transformers batch: {ratio:.1f}x")
        common.append_result({
            "workload": f"W1 {args.model}{extras} {n_items} LibriSpeech utts, Parquet->records, attention {r['attention']}",
            "ours": f"RTFx {audio_s / r['seconds']:.0f} ({r['slots']} slots)",
            "peer": f"transformers eager fp16 bs {best['batch']}: RTFx {audio_s / best['seconds']:.0f}",
            "ratio": f"{ratio:.1f}x", "wer": f"{100 * r['wer']:.2f} / {100 * best['wer']:.2f} %",
            "memory": r["memory"], "capture": f"{r['capture_s']:.1f} s",
        })  # fmt: skip


def main() -> None:
    args = _parser().parse_args()
    _diagnosis(args)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "w1.parquet"
        n_items, audio_s, refs = replicate(args.parquet, args.replicate, data)
        results, peers = _measure(args, data, audio_s, refs)
    _report(args, n_items, audio_s, results, peers)


if __name__ == "__main__":
    main()
