"""Batch invariance on the CPU (engine/cpu_numerics.py): MKL's reproducible mode asked for before
the first computation makes the flash attention's threads agree, and a fresh batch-invariant run
takes that fast path; a process where MKL ran first steps on the math attention and says why."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from batchscribe.api import Transcriber
from tests.conftest import REPO_ROOT
from tests.engine.helpers import GREEDY


def _fresh_python(code: str) -> str:
    """Run `code` in a new interpreter with MKL_CBWR unset and two torch threads; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["OMP_NUM_THREADS"] = "2"  # the flash kernel's tasks split over two threads even on a 1-core host
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_threads_agree_once_reproducible_mkl_is_requested_first() -> None:
    out = _fresh_python("""
        from batchscribe.engine.cpu_numerics import request_reproducible_mkl, threads_agree
        request_reproducible_mkl()
        print(threads_agree())
    """)
    assert out.split() == ["True"]


def test_a_fresh_batch_invariant_run_takes_the_fast_path_and_is_invariant(tiny_en_dir, shared_data) -> None:
    """In a new process the engine's resolution asks for the mode before anything computes: no
    math fallback, and each row's three shuffled copies give one record."""
    parquet = shared_data / "librispeech" / "test-other-subset-00000-of-00001.parquet"
    if not parquet.is_file():
        pytest.skip(f"shared data lacks {parquet}")
    out = _fresh_python(f"""
        import io, json, random
        import pyarrow.parquet as pq, soundfile as sf
        from batchscribe.api import Transcriber
        rows = pq.read_table({str(parquet)!r}).to_pylist()[:4]
        work = [(f"{{r['id']}}~{{k}}", sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")[0])
                for r in rows for k in range(3)]
        random.Random(0).shuffle(work)
        t = Transcriber({str(tiny_en_dir)!r}, device="cpu", temperatures=(0.0,), batch_invariant=True)
        copies = {{}}
        for record in t.transcribe_stream(work):
            copies.setdefault(record.pop("id").rsplit("~", 1)[0], set()).add(repr(record))
        print(json.dumps({{"math_steps": t.scheduler().engine.math_steps,
                           "copies": sorted(len(c) for c in copies.values()), "rows": len(copies)}}))
    """)
    assert json.loads(out.splitlines()[-1]) == {"math_steps": False, "copies": [1, 1, 1, 1], "rows": 4}


def test_where_threads_disagree_the_invariant_engine_steps_on_math_attention(tiny_en_dir, monkeypatch, caplog) -> None:
    monkeypatch.setattr("batchscribe.engine.engine.threads_agree", lambda: False)
    with caplog.at_level(logging.WARNING, logger="batchscribe.engine.engine"):
        invariant = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, batch_invariant=True, **GREEDY)
        assert invariant.scheduler().engine.math_steps
    assert "MKL_CBWR=AUTO,STRICT" in caplog.text
    default = Transcriber(str(tiny_en_dir), device="cpu", batch_size=2, **GREEDY)
    assert not default.scheduler().engine.math_steps  # only invariance pays for it
