"""Shared bits of the benchmark programs: hardware and commit facts, and the results table."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = (
    "| date | commit | hardware | workload | batchscribe | peer (same run) | ratio | WER ours / peer "
    "| peak GPU mem | capture | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def commit() -> str:
    """The checkout's commit; $BATCHSCRIBE_COMMIT where the tree travels without .git (the lent GPU)."""
    if os.environ.get("BATCHSCRIBE_COMMIT"):
        return os.environ["BATCHSCRIBE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def batch_invariant(flags: list[str]) -> bool | None:
    """A config's flags -> EngineOptions.batch_invariant: `invariant` on, `variant` off, else the
    engine's default (on with CUDA)."""
    return True if "invariant" in flags else False if "variant" in flags else None


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return f"CPU {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads (torch {torch.__version__})"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(fn, repeat: int = 10) -> float:
    """Device time per call of fn, from CUDA events around `repeat` calls after one warm-up."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def peak_gib() -> str:
    if not torch.cuda.is_available():
        return "-"
    return f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"


def append_result(row: dict[str, str]) -> None:
    """Append one row to benchmarks/RESULTS.md (created with its header when absent)."""
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by the programs in this folder; see BENCHMARKS.md "
                           "for the protocol.\n\n" + HEADER)  # fmt: skip
    cells = [dt.date.today().isoformat(), commit(), hardware(), row["workload"], row["ours"], row["peer"],
             row["ratio"], row.get("wer", "-"), row.get("memory", peak_gib()), row.get("capture", "-"),
             row.get("notes", "")]  # fmt: skip
    with RESULTS.open("a") as f:
        f.write("| " + " | ".join(cells) + " |\n")
