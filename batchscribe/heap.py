"""The cyclic garbage collector during a stream: rarer collections that skip what outlives it.

A stream allocates many small containers per item (segments, and with word timestamps a dict per
word, twice), so at Python's default threshold (a collection every 700 net new containers) the
collector runs every few items, and the words' dicts, still alive then, are scanned and promoted
again and again; each full collection also walks every tracked object of the process: the model's
modules, the CUDA graphs' state, every import. During a stream:

- `gc.freeze()` moves the objects alive at its start to a permanent generation collections skip
  (`gc.unfreeze()` gives them back when it ends; what died meanwhile is collected then);
- the youngest generation is collected after STREAM_GEN0 net new containers instead: a stream's
  records are dropped once written, so most of them are gone before a collection would scan them,
  and a cycle made meanwhile waits at most that many allocations for its memory to come back
  (the containers' own, a few MB, plus whatever large buffers a cycle holds).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

STREAM_GEN0 = 20_000  # net new tracked containers between collections of the youngest generation


@contextmanager
def stream_collector() -> Iterator[None]:
    """Freeze the objects alive now and raise the youngest generation's threshold until the block
    ends. Where the heap is already frozen (the caller's own, or an enclosing stream's), it and the
    thresholds are left to their owner."""
    if gc.get_freeze_count():
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], STREAM_GEN0), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
