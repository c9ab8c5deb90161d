"""SpeechStage with a stand-in detector (the model's own spans are tests/audio/test_vad.py's):
input order kept, batches within their bounds, a batch computed without waiting for one to fill,
the "nothing ready yet" protocol, a failing item isolated to an error naming it, the source's
error raised after what came before it, and close() ending both threads and the source."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from batchscribe.audio.vad import Speech
from batchscribe.audio.vad_stream import SpeechStage, VadBatching

SR = 16000


class Recorder:
    """Speech from the audio's first sample (its 'spans' say which item it is); logs each batch."""

    def __init__(self, fail_on: float | None = None, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.fail_on, self.delay = fail_on, delay

    def detect(self, audios: list[np.ndarray]) -> list[Speech]:
        self.batches.append([len(a) for a in audios])
        time.sleep(self.delay)
        if self.fail_on is not None and any(a[0] == self.fail_on for a in audios):
            raise RuntimeError("cannot score this one")
        return [Speech(((0, int(a[0])),), ((0, int(a[0])),)) for a in audios]


def _item(k: int, seconds: float = 1.0) -> tuple[str, np.ndarray]:
    return f"i{k}", np.full(int(seconds * SR), k + 1, dtype=np.float32)


def _drain(stage: SpeechStage) -> list[tuple]:
    """What a scheduler does: take entries, finish each at once (None never comes: nothing held)."""
    out = []
    for entry in stage:
        assert entry is not None
        out.append((entry, stage.finished(entry[0])))
    return out


def test_order_kept_and_batches_within_bounds() -> None:
    rng = np.random.default_rng(0)
    items = [_item(k, float(rng.choice([0.5, 3.0, 20.0]))) for k in range(200)]
    detector, batching = Recorder(delay=0.002), VadBatching(max_items=16, max_seconds=60.0)
    with SpeechStage(iter(items), detector, batching) as stage:
        out = _drain(stage)
    assert [e[0] for e, _ in out] == [i for i, _ in items]
    assert all(e[3].spans == ((0, int(a[0])),) and err is None for (e, err), (_, a) in zip(out, items))
    assert all(e[2] is None for e, _ in out)  # no prompt: None, where the scheduler expects one
    assert sum(map(len, detector.batches)) == 200
    assert all(len(b) <= 16 and (len(b) == 1 or sum(b) <= 60 * SR) for b in detector.batches)
    assert max(map(len, detector.batches)) > 1


def test_prompts_are_handed_on() -> None:
    items = [(*_item(0), "a prompt"), _item(1)]
    with SpeechStage(iter(items), Recorder()) as stage:
        out = _drain(stage)
    assert [e[2] for e, _ in out] == ["a prompt", None]


def test_a_batch_does_not_wait_for_more_input() -> None:
    """The source gives two items, then nothing until the consumer has them: no deadlock."""
    got_two = threading.Event()

    def source() -> Iterator[tuple]:
        yield _item(0)
        yield _item(1)
        assert got_two.wait(timeout=10)
        yield _item(2)

    with SpeechStage(source(), Recorder(), VadBatching(max_items=64)) as stage:
        first = []
        for _ in range(2):  # each waited for (nothing held), then finished
            first.append(next(stage))
            stage.finished(first[-1][0])
        got_two.set()
        rest = [e for e, _ in _drain(stage)]
    assert [e[0] for e in first + rest] == ["i0", "i1", "i2"]


def test_nothing_ready_is_none_only_while_the_consumer_holds_items() -> None:
    release = threading.Event()

    def source() -> Iterator[tuple]:
        yield _item(0)
        assert release.wait(timeout=10)
        yield _item(1)

    with SpeechStage(source(), Recorder()) as stage:
        assert next(stage)[0] == "i0"
        assert next(stage) is None  # it holds i0: it should step that
        assert stage.finished("i0") is None
        blocked = threading.Timer(0.3, release.set)
        blocked.start()
        t0 = time.monotonic()
        assert next(stage)[0] == "i1"  # it holds nothing: it waits for the next item
        assert time.monotonic() - t0 >= 0.25
        blocked.join()


def test_a_failing_item_is_an_error_naming_it_and_the_others_go_on() -> None:
    items = [_item(k) for k in range(10)]
    detector = Recorder(fail_on=5 + 1)  # item i5's samples are 6
    with SpeechStage(iter(items), detector, VadBatching(max_items=4)) as stage:
        out = _drain(stage)
    errors = {e[0]: err for e, err in out if err is not None}
    assert list(errors) == ["i5"] and errors["i5"].startswith("i5: voice activity detection (--vad) failed")
    assert "cannot score this one" in errors["i5"]
    assert out[5][0][3].spans == () and all(e[3].spans for e, err in out if err is None)
    assert [e[0] for e, _ in out] == [i for i, _ in items]


def test_an_items_error_from_the_detector_names_it() -> None:
    class Nan(Recorder):
        def detect(self, audios: list[np.ndarray]) -> list[Speech]:
            return [Speech((), (), "found non-finite speech probabilities") for _ in audios]

    with SpeechStage(iter([_item(0)]), Nan()) as stage:
        ((entry, error),) = _drain(stage)
    assert error == "i0: found non-finite speech probabilities"


def test_the_sources_error_comes_after_what_was_read_before_it() -> None:
    def source() -> Iterator[tuple]:
        yield _item(0)
        yield _item(1)
        raise OSError("the disk went away")

    with SpeechStage(source(), Recorder()) as stage:
        seen = []
        with pytest.raises(OSError, match="disk went away"):
            for entry in stage:
                seen.append(entry[0])
                stage.finished(entry[0])
    assert seen == ["i0", "i1"]


def test_a_live_sources_nothing_ready_is_waited_out() -> None:
    """ray/feed.py's None between items: the reader asks again; the consumer sees only items."""

    def source() -> Iterator[tuple | None]:
        for k in range(3):
            yield None
            yield _item(k)

    with SpeechStage(source(), Recorder()) as stage:
        assert [e[0] for e, _ in _drain(stage)] == ["i0", "i1", "i2"]


def test_close_ends_both_threads_and_closes_the_source_on_its_thread() -> None:
    closed_on: list[str] = []

    def endless() -> Iterator[tuple]:
        try:
            k = 0
            while True:
                yield _item(k)
                k += 1
        finally:
            closed_on.append(threading.current_thread().name)

    stage = SpeechStage(endless(), Recorder(delay=0.01), VadBatching(max_items=4))
    assert next(stage)[0] == "i0"
    stage.close()
    assert closed_on == ["batchscribe-vad-read"]
    assert not [t for t in threading.enumerate() if t.name.startswith("batchscribe-vad")]


def test_a_detector_that_drops_items_gives_each_an_error() -> None:
    class Drops(Recorder):
        def detect(self, audios: list[np.ndarray]) -> list[Speech]:
            return []

    with SpeechStage(iter([_item(0), _item(1)]), Drops()) as stage:
        out = _drain(stage)
    assert [(e[0], "returned 0 results for 1 items" in err) for e, err in out] == [("i0", True), ("i1", True)]


class Bug(BaseException):
    pass


def test_a_crash_of_the_scoring_thread_is_raised_to_the_consumer() -> None:
    class Broken(Recorder):
        def detect(self, audios: list[np.ndarray]) -> list[Speech]:
            raise Bug("not an item's failure")

    with SpeechStage(iter([_item(0), _item(1)]), Broken()) as stage:
        with pytest.raises(Bug):
            next(stage)


def _trickle(n: int, every: float) -> Iterator[tuple]:
    """A source whose items come as decode threads hand them on: one every `every` seconds."""
    for k in range(n):
        time.sleep(every)
        yield _item(k, 0.1)


def test_a_consumer_stepping_what_it_holds_gets_whole_batches() -> None:
    """A scheduler with free slots asks at every look and steps what it holds: it must not be
    handed the speech of one or two items per detector call. While it holds items, a batch waits
    for its fill (or `wait_seconds`); only a consumer with nothing to step gets a partial one."""
    detector, batching = Recorder(), VadBatching(max_items=8, wait_seconds=30.0)
    got, held = [], []
    with SpeechStage(_trickle(40, 0.002), detector, batching) as stage:
        for entry in stage:  # never finishes what it holds until the end: the engine is busy
            if entry is not None:
                got.append(entry[0])
                held.append(entry[0])
            else:
                time.sleep(0.001)  # one look
            if len(got) == 40:
                break
        for item_id in held:
            stage.finished(item_id)
    assert got == [f"i{k}" for k in range(40)]
    sizes = [len(b) for b in detector.batches]
    assert sum(sizes) == 40 and sizes[0] < 8, sizes  # the first: the consumer held nothing yet
    assert all(n == 8 for n in sizes[1:-1]) and 0 < sizes[-1] <= 8, sizes  # then whole ones, and the source's end


def test_a_partial_batch_waits_at_most_wait_seconds_while_the_consumer_holds_items() -> None:
    """The source stays open (a decode still running), so only the deadline releases the batch."""
    handed, done = threading.Event(), threading.Event()

    def source() -> Iterator[tuple]:
        yield _item(0, 0.1)
        handed.wait(timeout=30)
        yield from (_item(k, 0.1) for k in (1, 2))
        done.wait(timeout=30)

    with SpeechStage(source(), Recorder(), VadBatching(max_items=64, wait_seconds=0.3)) as stage:
        first = next(stage)  # scored alone: the consumer held nothing
        assert first is not None  # held from now on: the others wait for a fuller batch, but not forever
        handed.set()
        t0, rest = time.monotonic(), []
        while len(rest) < 2 and time.monotonic() - t0 < 10:
            entry = next(stage)
            if entry is None:
                time.sleep(0.005)
            else:
                rest.append(entry[0])
        waited = time.monotonic() - t0
        done.set()
    assert [first[0], *rest] == ["i0", "i1", "i2"]
    assert waited < 5.0


def test_ready_holds_an_engines_slots_worth_past_one_batch() -> None:
    """A GPU engine admits up to its slots at once: the stage scores ahead until `ready` holds
    `ready_items` (one batch would cap the engine at a batch of rows), and no further."""
    items = [_item(k, 0.1) for k in range(100)]
    batching = VadBatching(max_items=8, ready_items=40)
    with SpeechStage(iter(items), Recorder(), batching) as stage:
        first = next(stage)  # held: the consumer steps while the stage scores ahead
        deadline = time.monotonic() + 10
        while len(stage._ready) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # had it no bound, it would score on
        ahead = len(stage._ready)
        stage.finished(first[0])
        rest = [e for e, _ in _drain(stage)]
    assert 40 <= ahead < 48
    assert [first[0]] + [e[0] for e in rest] == [i for i, _ in items]
