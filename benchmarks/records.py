"""Host time to turn a finished window into segments and a record: the GPU engine thread's `finish`.

    python benchmarks/records.py [--model tiny.en] [--utterances 20] [--save-windows w.json]
    python benchmarks/records.py --windows w.json --model-dir HF_FOLDER   (no weights, no audio)
        [--repeat 300] [--rounds 5] [--profile 25] [--records-out records.jsonl]

Transcribes real speech once on the CPU (LibriSpeech train-clean-5, one ~13 s window per utterance,
as in W1), keeping what `WindowPlanner.fold` receives for every window (or loads windows saved by
an earlier run: the replay needs only the model folder's tokenizer.json). Then it replays those
windows many times through exactly the scheduler's host work and prints microseconds per window for
each part (WindowStats.from_decode, split_window, the item's record) and for the whole (`fold`,
then `transcript` and `transcript_record` for finished items), best of the rounds. `--records-out` writes the replayed
records as JSONL, so two versions of the code can be checked for byte-identical output.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from batchscribe.engine.scheduler import Scheduler
    from batchscribe.engine.windows import WindowPlanner

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PARQUET = REPO.parent / "shared" / "data" / "librispeech" / "train-clean-5-00000-of-00008.parquet"


@dataclass(frozen=True)
class Captured:
    """One call of `WindowPlanner.judge`: the item's state before it and the window's result."""

    item_id: str
    n_samples: int
    seek: int
    temp_index: int
    result: object  # engine.requests.FinishedWindow


def load_audio(parquet: Path, n: int) -> list[tuple[str, np.ndarray]]:
    import pyarrow.parquet as pq

    from batchscribe.audio.decode import decode_audio

    table = pq.read_table(parquet, columns=["id", "audio"]).slice(0, n)
    rows = zip(table.column("id").to_pylist(), table.column("audio").to_pylist())
    return [(item_id, decode_audio(audio["bytes"])) for item_id, audio in rows]


def capture(scheduler: Scheduler, items: list[tuple[str, np.ndarray]]) -> tuple[list[Captured], list[dict]]:
    """Transcribe once, keeping every window result the scheduler judges (in its order)."""
    from batchscribe.engine.windows import WindowPlanner
    from batchscribe.output.verbose_json import transcript_record

    seen: list[Captured] = []
    planner = scheduler.windows

    def spy(item, res):
        seen.append(Captured(item.id, len(item.audio), item.seek, item.temp_index, res))
        return WindowPlanner.judge(planner, item, res)

    planner.judge = spy  # an instance attribute: only this planner, only this run (judge, then settle)
    try:
        records = [transcript_record(t) for t in scheduler.run(items)]
    finally:
        del planner.judge
    return seen, records


def fresh_items(planner: WindowPlanner, windows: list[Captured], audio: dict[str, np.ndarray]) -> dict:
    """The items as the scheduler holds them when their first window finishes (no segments yet)."""
    return {w.item_id: planner.start(w.item_id, audio[w.item_id]) for w in windows}


def replay(planner: WindowPlanner, windows: list[Captured], items: dict) -> list[dict]:
    """The scheduler's per-window and per-item host work (Scheduler._collect), nothing else."""
    from batchscribe.output.verbose_json import transcript_record

    records = []
    for w in windows:
        item = items[w.item_id]
        if planner.fold(item, w.result):
            records.append(transcript_record(planner.transcript(item)))
    return records


def best_of(rounds: int, repeat: int, fn: Callable[[], object]) -> float:
    """Seconds per call of fn, the best round of `repeat` calls (the least disturbed by the machine)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def parts(
    planner: WindowPlanner, windows: list[Captured], audio: dict[str, np.ndarray], rounds: int, repeat: int
) -> dict[str, Callable[[], object]]:
    """Each part alone, on the arguments the planner gave it in one replay (recorded by a spy)."""
    from batchscribe.engine import windows as windows_module
    from batchscribe.output.verbose_json import transcript_record
    from batchscribe.segments import WindowStats

    tok = planner.tokenizer
    splits = []
    real_split = windows_module.split_window

    def spy(*args, **kwargs):
        splits.append((args, kwargs))
        return real_split(*args, **kwargs)

    items = fresh_items(planner, windows, audio)
    windows_module.split_window = spy
    try:
        replay(planner, windows, items)
    finally:
        windows_module.split_window = real_split
    results = [w.result for w in windows]

    def window_stats() -> None:
        for r in results:
            WindowStats.from_decode(r.tokens, tok, temperature=r.temperature, sum_logprob=r.sum_logprob,
                                    no_speech_prob=r.no_speech_prob)  # fmt: skip

    def split() -> None:
        for args, kwargs in splits:
            real_split(*args, **kwargs)

    def record() -> None:
        for item in items.values():
            transcript_record(planner.transcript(item))

    def total() -> None:
        replay(planner, windows, next(item_sets))

    # Items are built ahead, outside the clock: the scheduler builds them when it reads their audio.
    item_sets = iter([fresh_items(planner, windows, audio) for _ in range(rounds * repeat)])
    return {"WindowStats.from_decode": window_stats, "split_window": split, "record (transcript_record)": record,
            "total (fold + record)": total}  # fmt: skip


def save_windows(path: Path, windows: list[Captured], records: list[dict]) -> None:
    rows = [{**{k: v for k, v in vars(w).items() if k != "result"}, "result": vars(w.result)} for w in windows]
    path.write_text(json.dumps({"windows": rows, "records": records}, ensure_ascii=False), encoding="utf-8")


def load_windows(path: Path) -> tuple[list[Captured], list[dict]]:
    from batchscribe.engine.requests import FinishedWindow

    data = json.loads(path.read_text(encoding="utf-8"))
    windows = [Captured(**{**row, "result": FinishedWindow(**row["result"])}) for row in data["windows"]]
    return windows, data["records"]


def transcribe(args: argparse.Namespace) -> tuple[WindowPlanner, list[Captured], list[dict]]:
    """The planner of a real model's scheduler, and the windows it folded in transcribing real speech."""
    from batchscribe.api import Transcriber
    from batchscribe.config import default_cache_dir

    cache = args.cache_dir or (REPO / ".pytest_models" if (REPO / ".pytest_models").is_dir() else default_cache_dir())
    scheduler = Transcriber(args.model, device="cpu", cache_dir=cache).scheduler()
    items = load_audio(args.parquet, args.utterances)
    t0 = time.perf_counter()
    windows, records = capture(scheduler, items)
    print(f"transcribed {len(items)} utterances in {time.perf_counter() - t0:.1f} s")
    return scheduler.windows, windows, records


def weightless_planner(folder: Path) -> WindowPlanner:
    """A planner from the folder's tokenizer alone: finishing windows reads nothing else."""
    from batchscribe.config import DecodeOptions
    from batchscribe.engine.windows import WindowPlanner
    from batchscribe.model.dims import ModelDims
    from batchscribe.model.tokenizer import Tokenizer

    dims = ModelDims.from_hf_config(json.loads((folder / "config.json").read_text()))
    return WindowPlanner(Tokenizer.from_folder(folder, multilingual=dims.is_multilingual), DecodeOptions())


def main() -> None:
    import platform

    import torch

    import common

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", type=Path, default=DEFAULT_PARQUET)
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="converted models (default: the checkout's .pytest_models when present)")
    ap.add_argument("--utterances", type=int, default=20)
    ap.add_argument("--save-windows", type=Path, default=None, help="write the captured windows (JSON)")
    ap.add_argument("--windows", type=Path, default=None, help="replay windows saved by --save-windows")
    ap.add_argument("--model-dir", type=Path, default=None, help="with --windows: config.json + tokenizer.json")
    ap.add_argument("--repeat", type=int, default=300, help="replays of all windows per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS", help="cProfile the replay; print ROWS rows")
    ap.add_argument("--records-out", type=Path, default=None, help="write the replayed records (JSONL)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.windows:
        if args.model_dir is None:
            ap.error("--windows needs --model-dir (a Hugging Face folder with config.json and tokenizer.json)")
        planner = weightless_planner(args.model_dir)
        windows, transcribed = load_windows(args.windows)
    else:
        planner, windows, transcribed = transcribe(args)
        if args.save_windows:
            save_windows(args.save_windows, windows, transcribed)
    print(f"{common.hardware()}, Python {platform.python_version()}, commit {common.commit()}")
    lengths = {w.item_id: w.n_samples for w in windows}
    audio = {item_id: np.zeros(n, np.float32) for item_id, n in lengths.items()}  # only its length is read
    print(f"{len(lengths)} items, {len(windows)} windows, "
          f"{sum(len(w.result.tokens) for w in windows) / len(windows):.1f} tokens and "
          f"{sum(len(r['segments']) for r in transcribed) / len(windows):.1f} segments per window")  # fmt: skip

    records = replay(planner, windows, fresh_items(planner, windows, audio))
    by_id = {r["id"]: r for r in transcribed}
    assert all(json.dumps(r) == json.dumps(by_id[r["id"]]) for r in records), "the replay differs from the run"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    print(f"records sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}")
    if args.records_out:
        args.records_out.write_text(text, encoding="utf-8")

    n = len(windows)
    print("\n| part | us per window |\n|---|---:|")
    for name, fn in parts(planner, windows, audio, args.rounds, args.repeat).items():
        seconds = best_of(args.rounds, args.repeat, fn)
        print(f"| {name} | {seconds / n * 1e6:.1f} |")
    if args.profile:
        with cProfile.Profile() as prof:
            for _ in range(args.repeat):
                replay(planner, windows, fresh_items(planner, windows, audio))
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
