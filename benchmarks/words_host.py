"""Host cost of --word-timestamps per finished window: the scheduler's "finish" work with and without words.

    python benchmarks/words_host.py [--rows 100] [--repeat 20] [--profile] [--capture FILE]

Runs real tiny.en on the CPU with word timestamps over LibriSpeech rows (W1's: the first rows of
train-clean-5, ~13 s utterances, plus a few minutes of long-form audio for multi-window items) and records, for every
finished window, the item's state before `judge`, the engine's FinishedWindow and the alignment pass's
output. It then replays those windows through the host functions alone, many times over:

- `off`: judge + settle under the same options with words off (what "finish" costs without words);
- `on`: judge + settle with words, from the recorded alignments;
- `word_timings` and `attach_words` alone.

Per-window microseconds are the median over the repeats (the replays repeat the same windows, so the
host caches are warm; one line times the `on` replay from emptied caches). `--profile` prints cProfile's top
functions for the `on` replay. The digest is of every settled window's segments and words: equal
digests before and after a change mean equal outputs. `--capture FILE` keeps the recorded windows
(pickle) so that later runs skip the decode.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import hashlib
import io
import pickle
import pstats
import statistics
import time
from dataclasses import replace
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def capture(rows: int, model_dir: Path) -> list[tuple]:
    """(item before judge, FinishedWindow, Alignment or None) of every window of a real run."""
    import pyarrow.parquet as pq
    import soundfile as sf

    from batchscribe.api import Transcriber
    from batchscribe.audio.decode import decode_audio

    table = pq.read_table(DATA / "librispeech" / "train-clean-5-00000-of-00008.parquet").to_pylist()[:rows]
    items = [(r["id"], sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0]) for r in table]
    longform = DATA / "longform" / "librispeech-concat" / "19-198-longform.flac"
    if longform.exists():
        items.append(("longform", decode_audio(longform)[: 16000 * 150]))
    t = Transcriber(str(model_dir), device="cpu", batch_size=8, word_timestamps=True, temperatures=(0.0,))
    planner = t.scheduler().windows
    seen: list[tuple] = []
    judge, settle = planner.judge, planner.settle
    before: dict[int, object] = {}

    def recording_judge(item, res):
        before[id(item)] = (replace(item, segments=list(item.segments)), res)
        return judge(item, res)

    def recording_settle(item, judged, alignment=None):
        snapshot, res = before.pop(id(item))
        seen.append((snapshot, res, alignment))
        return settle(item, judged, alignment)

    planner.judge, planner.settle = recording_judge, recording_settle
    t.transcribe(items, sample_rate=16000)
    return seen


def _copies(windows: list[tuple], n: int) -> list[list]:
    """n fresh copies of each recorded item (settle changes them), made outside the clock."""
    return [[replace(item, segments=list(item.segments)) for item, _, _ in windows] for _ in range(n)]


def replay(planner, windows: list[tuple], items: list, words: bool) -> list:
    out = []
    for item, (_, res, alignment) in zip(items, windows):
        judged = planner.judge(item, res)
        planner.settle(item, judged, alignment if words else None)
        out.append(item)
    return out


def digest(items: list) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(repr((item.seek, item.last_speech, [(s.start, s.end, s.text, s.tokens, s.words)
                                                      for s in item.segments])).encode())  # fmt: skip
    return h.hexdigest()[:16]


def per_window_us(fn, n_windows: int, repeat: int) -> list[float]:
    times = []
    for k in range(repeat):
        t0 = time.perf_counter()
        fn(k)
        times.append((time.perf_counter() - t0) / n_windows * 1e6)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100, help="train-clean-5 rows to decode")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--model", default="tiny.en", help="name or folder (the default cache: BATCHSCRIBE_CACHE)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--capture", type=Path, help="pickle of the recorded windows: read if present, else written")
    args = ap.parse_args()

    from batchscribe.config import DecodeOptions
    from batchscribe.engine.windows import WindowPlanner
    from batchscribe.model.tokenizer import Tokenizer
    from batchscribe.weights import resolve_model
    from batchscribe.words import WindowWords, attach_words, word_timings

    model_dir = resolve_model(args.model)
    if args.capture and args.capture.exists():
        windows = pickle.loads(args.capture.read_bytes())
    else:
        windows = capture(args.rows, model_dir)
        if args.capture:
            args.capture.write_bytes(pickle.dumps(windows))
    tok = Tokenizer.from_folder(model_dir)
    on = WindowPlanner(tok, DecodeOptions(word_timestamps=True, temperatures=(0.0,)))
    off = WindowPlanner(tok, replace(on.options, word_timestamps=False))
    aligned = [w for w in windows if w[2] is not None]
    n = len(windows)
    print(f"{n} windows ({len(aligned)} aligned, "
          f"{sum(len(w[2].token_probs) for w in aligned)} text tokens) of {len({w[0].id for w in windows})} items")

    # Inputs of the word functions alone, from one words-on replay.
    splits = []
    for item, res, alignment in aligned:
        item = replace(item, segments=list(item.segments))
        judged = on.judge(item, res)
        segs = judged.split.segments
        text = [t for s in segs for t in s.tokens if t < tok.eot]
        counts = [sum(t < tok.eot for t in s.tokens) for s in segs]  # as the word stage gives them
        splits.append((segs, text, alignment, item.seek * 160 / 16000, item.last_speech, counts))

    def timings_only(_k):
        for _, text, al, _, _, _ in splits:
            word_timings(al.path, text, al.token_probs, tok)

    timed = [word_timings(al.path, text, al.token_probs, tok) for _, text, al, _, _, _ in splits]

    def attach_only(k):
        for (segs, _, _, offset, last, counts), words in zip(splits, copies_t[k]):
            window = WindowWords([s.start for s in segs], [s.end for s in segs], counts)
            attach_words(window, words, offset, last)

    for name in ("off", "on", "off", "on"):  # twice, alternating: the machine is shared
        planner, words = (on, True) if name == "on" else (off, False)
        copies = _copies(windows, args.repeat)
        us = per_window_us(lambda k: replay(planner, windows, copies[k], words), n, args.repeat)
        print(f"{name:>4} judge+settle: {statistics.median(us):7.1f} us/window (min {min(us):.1f})"
              f"  digest {digest(replay(planner, windows, _copies(windows, 1)[0], words))}")
    # Once more from empty caches (per-token texts, rounded times): the cost of a run's first windows.
    from batchscribe import words as words_module

    cold = []
    for _ in range(args.repeat):
        for cache in ("_ROUNDED", "_TOKEN_PIECES"):  # absent before they were added: nothing to empty
            getattr(words_module, cache, {}).clear()
        items = _copies(windows, 1)[0]
        cold += per_window_us(lambda _k: replay(on, windows, items, True), n, 1)
    print(f"  on judge+settle, caches emptied first: {statistics.median(cold):7.1f} us/window")
    us = per_window_us(timings_only, len(aligned), args.repeat)
    print(f"word_timings:       {statistics.median(us):7.1f} us/aligned window (min {min(us):.1f})")
    copies_t = [copy.deepcopy(timed) for _ in range(args.repeat)]
    us = per_window_us(attach_only, len(aligned), args.repeat)
    print(f"attach_words:       {statistics.median(us):7.1f} us/aligned window (min {min(us):.1f})")

    if args.profile:
        copies = _copies(windows, 3)
        prof = cProfile.Profile()
        prof.enable()
        for k in range(3):
            replay(on, windows, copies[k], True)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
