"""Items in, transcripts out: which windows take the free slots, and when the host looks.

Windows from many items share the engine's slots: as slots free up, queued windows are admitted in
groups (so the encoder runs batched), an item's next window (its next seek, or the same window at the
next temperature) is queued as soon as the previous one finishes, and once nothing is left to admit
the tail's running windows are compacted into low rows. Each turn of the loop is schedule -> run ->
postprocess: pull items and admit a group, launch one look of steps, then fold in the windows that
finished in the look `lag` turns back (on the GPU the newest steps are still queued when the host
reads it, so the device never waits for the host; finished rows are inert, so the lag never changes
a record).

With word timestamps, the windows of a read whose words are timed are judged and held
(engine/align_queue.py) until their alignment batch is full enough to send, a few collects at most;
once their pass is queued they wait (`_Aligning`) until the next collect (or `align_lag` collects
after it), which first settles them once the pass's copies have landed: their words attached,
their items yielded or their next windows queued. Always by counts of collects, never "when ready", so
the schedule (and every record) is the same however fast the device is, and the device steps the
look queued since while the host waits and folds. The loop ends only after a collect with no slot
in use: it sends every held window, and the next such collect settles them (and every pass still
waiting); every window having been read, nothing new is sent then.
NOTE: the pass reads each window's cross K/V from the slot its read freed. Until the pass is queued
that slot is held out of admission, and every held window is sent before a compaction, so stream
order keeps the slot intact for the pass.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from batchscribe.engine.align_queue import AlignQueue, Held
from batchscribe.engine.alignment import Alignment, PendingAlignment
from batchscribe.engine.engine import Engine
from batchscribe.engine.requests import FinishedWindow
from batchscribe.engine.windows import ItemProgress, Judged, WindowPlanner
from batchscribe.segments import Transcript

log = logging.getLogger(__name__)
# Collects a partly filled alignment batch may wait for more windows on CUDA (engine/align_queue.py).
ALIGN_HOLD = 6
# Collects a queued alignment pass waits beyond the next before being settled, on CUDA. 0: the next
# collect settles it, waiting on the device for the pass just queued behind the previous look; 1
# lets the host fold other windows meanwhile, which pays where the host outruns the pass
# (docs/GPU_NOTES.md, thirty-fifth session).
ALIGN_LAG = 1


@dataclass(frozen=True)
class SchedulePolicy:
    check_every: int  # steps per look
    lag: int  # looks between queueing a snapshot and reading it
    admit_min: int  # admit a group once this many slots are free (or nothing runs, or input ended)
    # Looks queued just before an admission: the GPU steps the running rows while the host packs the
    # group, instead of idling once the look behind the lag is done.
    looks_before_admission: int
    compact_tail: bool = True  # compact once nothing is left to admit and it halves the rows
    # Samples of audio the items in flight may hold before no new item is taken (None: no bound):
    # at most this plus one item's, whatever the items' lengths.
    max_live_samples: int | None = None
    # Collects a partly filled alignment batch may wait for more finished windows (0: sent at once).
    align_hold: int = 0
    # Collects a queued alignment pass waits beyond the next one before being settled (0: the next).
    align_lag: int = 0

    @classmethod
    def for_engine(cls, engine: Engine) -> SchedulePolicy:
        """The default: on CUDA the engine's steps per look, a lag of 1 and, with graphs, two looks
        before each admission; on the CPU one step per look and no lag (looking is free there).
        Admit when a quarter of the slots are free, so the encoder sees groups, not single windows.
        The items in flight hold at most the engine's audio_memory of float32 samples. Alignment
        batches wait for more windows only on CUDA, where a batch's shape is fixed."""
        cuda = engine.device.type == "cuda"
        return cls(check_every=engine.steps_per_look, lag=1 if cuda else 0, admit_min=max(1, engine.n_slots // 4),
                   looks_before_admission=2 if engine.graphs is not None else 0,
                   max_live_samples=engine.config.audio_memory // 4, align_hold=ALIGN_HOLD if cuda else 0,
                   align_lag=ALIGN_LAG if cuda else 0)  # fmt: skip


@dataclass(frozen=True)
class _Aligning:
    """Windows whose alignment pass is queued (one send): settled by the next collect, or
    `align_lag` collects after it."""

    keys: list[int]
    verdicts: list[Judged]
    words: PendingAlignment  # one alignment per key, in order
    sent: int  # the collect that queued the pass (_Run.collects)


@dataclass
class _Run:
    """One stream's bookkeeping."""

    source: Iterator[tuple | None]  # (id, audio[, prompt[, speech]]); None: nothing ready yet
    exhausted: bool = False
    # key -> item with a window queued, in a slot, or being aligned
    live: dict[int, ItemProgress] = field(default_factory=dict)
    queue: deque[int] = field(default_factory=deque)  # keys whose next window waits for a slot
    aligning: list[_Aligning] = field(default_factory=list)  # queued passes not yet settled, oldest first
    held: AlignQueue | None = None  # windows waiting for a fuller alignment batch (word timestamps)
    collects: int = 0  # collects so far
    next_key: int = 0
    live_samples: int = 0  # the audio the live items hold
    held_back: bool = False  # the audio budget has kept an item out (said once a stream)


class Scheduler:
    """Transcribes streams of (id, audio) items on one engine; yields Transcripts as items finish."""

    def __init__(self, engine: Engine, windows: WindowPlanner, policy: SchedulePolicy | None = None):
        self.engine, self.windows = engine, windows
        self.policy = policy or SchedulePolicy.for_engine(engine)
        self.admit_max = engine.n_slots  # lowered when an admission runs out of memory
        # Host seconds (and counts) per stage, for benchmarks; `marks`: when (perf_counter) the last
        # stream started, got its first input, first and last admitted, yielded its last record.
        self.timings: defaultdict[str, float] = defaultdict(float)
        self.marks: dict[str, float] = {}

    @contextmanager
    def _timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] += time.perf_counter() - t0

    def run(self, items: Iterable[tuple | None], policy: SchedulePolicy | None = None) -> Iterator[Transcript]:
        """Transcripts of `items` ((id, float32 mono 16 kHz array), or (id, array, the item's initial
        prompt or None), or (id, array, prompt or None, its --vad Speech)) as they finish, not in
        input order. A source may give None for "nothing ready yet" (ray/feed.py, vad_stream.py):
        the scheduler steps what it has and asks again on its next turn."""
        policy, run, engine = policy or self.policy, _Run(iter(items)), self.engine
        if engine.aligner is not None:
            run.held = AlignQueue(engine.aligner, policy.align_hold)
        engine.reset()  # a stream given up on may have left windows in the slots
        self.marks.clear()
        self.marks["start"] = time.perf_counter()
        self.windows.trims.reset()  # counts this stream's long --prompt-column prompts
        while True:
            free = engine.slots.free_slots()  # one list a turn: pulling changes no slot
            yield from self._pull(run, policy, len(free))
            n_rows = engine.slots.rows_in_use()
            admitted = self._admit(run, policy, free, n_rows)
            if admitted is None:
                continue  # out of memory: the group was requeued, admission groups shrank
            if admitted:
                n_rows = engine.slots.rows_in_use()
            if n_rows == 0:  # every slot is free, so queued snapshots hold no finished window
                # This collect also settles the windows being aligned (their items may queue windows)
                # and sends every held one: nothing runs that could fill their batches.
                yield from self._collect(run, keep=0, drain=True)
                if run.exhausted and not run.queue and not run.aligning:
                    assert not run.live, "a run ended with items unfinished"
                    engine.release_staging()
                    self.windows.trims.report()
                    return
                continue
            with self._timed("step_launch"):
                n_rows = self._compact(run, policy, n_rows)
                self._advance(n_rows, policy)
            yield from self._collect(run, keep=policy.lag, align_lag=policy.align_lag)

    def _pull(self, run: _Run, policy: SchedulePolicy, free: int) -> Iterator[Transcript]:
        """Read items until a group's worth of windows is queued (at most `free`, the free slots):
        at most one admission group ahead, so the GPU starts on the first group while the decode
        workers fill the next. Empty items finish at once."""
        while not run.exhausted and len(run.queue) < min(free, policy.admit_min):
            if run.live and policy.max_live_samples is not None and run.live_samples >= policy.max_live_samples:
                self._hold_back(run, policy.max_live_samples)
                break
            t0 = time.perf_counter()
            try:
                entry = next(run.source)  # (id, audio[, the item's prompt[, its --vad Speech]])
            except StopIteration:
                run.exhausted = True
                break
            finally:
                t1 = time.perf_counter()
                self.timings["wait_input"] += t1 - t0
            if entry is None:  # a live source with nothing ready yet (ray/feed.py): step what is in flight
                break
            self.marks.setdefault("first_input", t1)
            item_id, audio, *rest = entry  # rest: the item's prompt, then (--vad) its Speech
            item = self.windows.start(item_id, audio, *rest)
            if item.done:  # no audio, or (--vad) no speech
                yield self.windows.transcript(item)
                continue
            run.live[run.next_key] = item
            run.live_samples += len(item.audio)
            self.timings["live_samples_peak"] = max(self.timings["live_samples_peak"], run.live_samples)
            run.queue.append(run.next_key)
            run.next_key += 1

    def _hold_back(self, run: _Run, budget: int) -> None:
        """The items in flight hold the audio budget: take no new one this turn (counted; said once)."""
        self.timings["held_back"] += 1
        if not run.held_back:
            run.held_back = True
            log.warning("%d items in flight hold %.1f GB of decoded audio, the engine's budget (--audio-memory, "
                        "EngineOptions.audio_memory; by default a quarter of this machine's memory): new items "
                        "wait for one to finish, so fewer decoder slots may be busy", len(run.live),
                        4 * budget / 1e9)  # fmt: skip

    def _admit(self, run: _Run, policy: SchedulePolicy, free: list[int], n_rows: int) -> int | None:
        """Admit one group into the `free` slots when there are enough of them (`n_rows`: rows in
        use); the group's size, 0 when none was admitted, None when it ran out of memory (the group
        is queued again)."""
        engine = self.engine
        if not (run.queue and free and (len(free) >= policy.admit_min or n_rows == 0 or run.exhausted)):
            return 0
        t0 = time.perf_counter()
        for _ in range(policy.looks_before_admission if n_rows else 0):
            self._advance(n_rows, policy)
        group = [run.queue.popleft() for _ in range(min(len(free), len(run.queue), self.admit_max))]
        try:
            engine.admit([self.windows.request(k, run.live[k]) for k in group], free[: len(group)])
        except torch.OutOfMemoryError:
            # The encoder's activations for this group did not fit: nothing was admitted (slots are
            # claimed only after encoding), so requeue and admit smaller groups.
            if len(group) == 1:
                raise
            run.queue.extendleft(reversed(group))
            self.admit_max = max(1, len(group) // 2)
            log.warning("out of memory admitting %d windows; admitting at most %d at a time", len(group), self.admit_max)
            if engine.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        self.marks["last_admit"] = time.perf_counter()
        self.marks.setdefault("first_admit", t0)
        self.timings["admit"] += self.marks["last_admit"] - t0
        self.timings["windows"] += len(group)
        return len(group)

    def _compact(self, run: _Run, policy: SchedulePolicy, n_rows: int) -> int:
        """Once nothing is left to admit, move running windows down into the holes finished ones
        left whenever that at least halves the rows each step covers."""
        if policy.compact_tail and run.exhausted and not run.queue and 2 * self.engine.slots.slots_in_use() <= n_rows:
            self._send_held(run, force=True)  # before the move: it may refill their slots
            self.timings["compactions"] += 1
            return self.engine.compact()
        return n_rows

    def _advance(self, n_rows: int, policy: SchedulePolicy) -> None:
        """One look's steps over rows [0, n_rows), counted."""
        self.engine.advance(n_rows, policy.check_every)
        self.timings["steps"] += policy.check_every
        self.timings["row_steps"] += n_rows * policy.check_every

    def _collect(self, run: _Run, keep: int, drain: bool = False, align_lag: int = 0) -> Iterator[Transcript]:
        """Fold in the finished windows of every queued snapshot but the newest `keep`; yield the
        items that have no audio left, requeue the others' next windows. First settle what the
        previous collect sent to the alignment pass (or `align_lag` collects before it); what this
        one sends waits for the next (`drain`: settle every pass and send every held window, as
        nothing runs)."""
        engine = self.engine
        run.collects += 1
        yield from self._settle_aligned(run, None if drain else align_lag)
        while engine.pending_snapshots() > keep:
            with self._timed("wait_snapshot"):
                snap = engine.wait_snapshot()  # on the GPU: the look before the newest is done
            with self._timed("collect"):
                finished = engine.finished(snap)
            t0 = time.perf_counter()
            verdicts = [self.windows.judge(run.live[res.key], res) for res in finished]
            self.timings["finish"] += time.perf_counter() - t0
            timed = self._align(run, finished, verdicts)  # timed as "align"
            yield from self._settle(run, [(res.key, v, None) for k, (res, v) in enumerate(zip(finished, verdicts))
                                          if k not in timed])  # fmt: skip
        if run.held is not None:
            # Too few windows run to fill a batch: sending now keeps their items from waiting.
            self._send_held(run, force=drain or engine.slots.slots_in_use() < engine.aligner.max_batch)

    def _settle(self, run: _Run, judged: list[tuple[int, Judged, Alignment | None]]) -> Iterator[Transcript]:
        """Apply judged windows (key, verdict, alignment) to their items: yield the items that
        have no audio left, requeue the others' next windows."""
        clock, t0 = self.timings, time.perf_counter()
        for key, verdict, alignment in judged:
            item = run.live[key]
            if not self.windows.settle(item, verdict, alignment):
                run.queue.append(key)
                continue
            del run.live[key]
            run.live_samples -= len(item.audio)
            transcript = self.windows.transcript(item)
            self.marks["last_record"] = time.perf_counter()
            clock["finish"] += self.marks["last_record"] - t0
            yield transcript
            t0 = time.perf_counter()
        clock["finish"] += time.perf_counter() - t0

    def _align(self, run: _Run, finished: list[FinishedWindow], verdicts: list[Judged]) -> set[int]:
        """With word timestamps: hold every window of this read whose segments get words, their
        slots kept out of admission (just freed, nothing is queued behind them yet), until
        `_send_held` queues their pass (an item's next seek is its last word's end, so its next
        window waits too). Returns the indices of the windows held."""
        requests = [self.windows.align_request(run.live[res.key], v, res.slot) for res, v in zip(finished, verdicts)]
        wanted = [k for k, r in enumerate(requests) if r is not None]
        if wanted:
            assert run.held is not None, "words to time on an engine without alignment heads"
            self.engine.hold_for_alignment([requests[k].slot for k in wanted])
            for k in wanted:
                run.held.add(Held(finished[k].key, verdicts[k], requests[k]))
        return set(wanted)

    def _send_held(self, run: _Run, force: bool) -> None:
        """Queue the alignment pass over the held windows that are due (all with `force`); the
        next collect settles them."""
        if run.held is None:
            return
        due = run.held.take(force)
        self.timings["align_held"] += len(run.held)  # window-collects waited, for benchmarks
        if due:
            with self._timed("align"):
                words = self.engine.submit_alignment([h.request for h in due])
            run.aligning.append(_Aligning([h.key for h in due], [h.verdict for h in due], words, run.collects))
            self.timings["aligned_windows"] += len(due)
            self.timings["align_sends"] += 1

    def _settle_aligned(self, run: _Run, lag: int | None) -> Iterator[Transcript]:
        """Settle the windows sent to the alignment pass at least `lag` + 1 collects ago (every one
        with None), in the order they were read, each pass waited for (on CUDA: its copies' event)."""
        due = len(run.aligning) if lag is None else sum(run.collects - a.sent > lag for a in run.aligning)
        pending, run.aligning = run.aligning[:due], run.aligning[due:]  # sent in order: the due come first
        for aligning in pending:
            with self._timed("align_wait"):  # the wait, then the paths unpacked
                alignments = aligning.words.result()
            yield from self._settle(run, list(zip(aligning.keys, aligning.verdicts, alignments)))
