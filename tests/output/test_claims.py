"""Writers started together (the parts of an array job) cannot mix settings in one folder: each
live writer's claim is compared before any has records (output/claims.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from batchscribe.output.claims import claim_folder
from batchscribe.output.lock import claim_name, lock_output
from batchscribe.output.resume import ResumeConflictError

PARTS = ("records-part00000of00002", "records-part00001of00002")


def _config(model: str = "tiny.en", fingerprint: str = "f1") -> dict:
    return {"model": model, "decode_options": {"task": "transcribe"}, "format": "jsonl", "inputs": ["in.parquet"],
            "inputs_fingerprint": fingerprint, "source_options": {}, "num_shards": 2, "id_scheme": "origin"}


def test_a_part_started_beside_a_live_one_with_other_settings_is_refused(tmp_path: Path) -> None:
    """Neither part has records yet (so the run configs say nothing): the second part's other
    model is refused by name, the same settings pass, and --retry-errors' ignored key is ignored."""
    first = lock_output(tmp_path, PARTS[0])
    claim_folder(tmp_path, PARTS[0], _config())
    second = lock_output(tmp_path, PARTS[1])
    with pytest.raises(ResumeConflictError) as err:
        claim_folder(tmp_path, PARTS[1], _config(model="base"))
    msg = str(err.value)
    assert "another batchscribe run is writing into" in msg and "(shard part00000of00002)" in msg
    assert '--model: before "tiny.en", now "base"' in msg and "choose another --output" in msg
    with pytest.raises(ResumeConflictError, match="the input files"):
        claim_folder(tmp_path, PARTS[1], _config(fingerprint="f2"))
    claim_folder(tmp_path, PARTS[1], _config(fingerprint="f2"), ignore=("inputs_fingerprint",))
    claim_folder(tmp_path, PARTS[1], _config())
    second.release()
    first.release()


def test_a_dead_writers_claim_binds_nobody(tmp_path: Path) -> None:
    """A claim is a live writer's: once its process is gone (here killed outright) another part
    may start with other settings (records, if it left any, are the run configs' to check)."""
    script = (f"from batchscribe.output.lock import lock_output\nfrom batchscribe.output.claims import claim_folder\n"
              f"lock_output({str(tmp_path)!r}, {PARTS[0]!r})\nclaim_folder({str(tmp_path)!r}, {PARTS[0]!r}, "
              f"{_config()!r})\nprint('claimed', flush=True)\nimport time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
        with lock_output(tmp_path, PARTS[1]):
            with pytest.raises(ResumeConflictError):
                claim_folder(tmp_path, PARTS[1], _config(model="base"))
    finally:
        proc.kill()
        proc.wait()
    with lock_output(tmp_path, PARTS[1]):
        claim_folder(tmp_path, PARTS[1], _config(model="base"))
    assert (tmp_path / claim_name(PARTS[0])).is_file()  # left behind, and ignored


def test_a_writer_drops_its_old_claim_as_it_takes_its_lock(tmp_path: Path) -> None:
    """A part restarted with new settings is live before it claims again: until then it has no
    claim, so a part starting beside it is compared with nothing stale (it will compare itself)."""
    with lock_output(tmp_path, PARTS[0]):
        claim_folder(tmp_path, PARTS[0], _config(model="base"))
    first = lock_output(tmp_path, PARTS[0])  # the same part again: its claim from before is gone
    assert not (tmp_path / claim_name(PARTS[0])).exists()
    with lock_output(tmp_path, PARTS[1]):
        claim_folder(tmp_path, PARTS[1], _config())
        with pytest.raises(ResumeConflictError):
            claim_folder(tmp_path, PARTS[0], _config(model="base"))  # and then it is refused itself
    first.release()


def test_the_engines_of_parts_running_together_must_match(tmp_path: Path) -> None:
    """Once each part's model has loaded: another dtype or other kernels (a part on another kind of
    GPU) are refused by the flag behind them; a part that has not reached its engine yet binds no
    engine."""
    from batchscribe.output.claims import claim_engine

    engine = {"dtype": "float16", "attention": "triton/flashinfer_hnd/float16"}
    first, second = lock_output(tmp_path, PARTS[0]), lock_output(tmp_path, PARTS[1])
    claim_folder(tmp_path, PARTS[0], _config())
    claim_folder(tmp_path, PARTS[1], _config())
    claim_engine(tmp_path, PARTS[1], {**engine, "dtype": "bfloat16"})  # part 0 has no engine yet
    with pytest.raises(ResumeConflictError, match='--dtype: before "bfloat16", now "float16"'):
        claim_engine(tmp_path, PARTS[0], engine)
    claim_engine(tmp_path, PARTS[0], {**engine, "dtype": "bfloat16"})
    second.release()
    first.release()
