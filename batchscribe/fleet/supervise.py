"""Running a `--gpus` run: the children started, watched, restarted after a crash, stopped on
SIGTERM; their progress folded into one stream and their summaries into one summary.

The parent holds its own lock beside the children's (output/lock.py): a second `--gpus` run into
the folder is refused before any child starts, and `--overwrite`'s deletion happens here, once,
before the children exist. Each child owns its writer prefix; a child that dies is started again
and resumes from its own manifest, so what it committed is kept and what it had in flight is redone.
Children run in their own session: a Ctrl-C or Slurm's SIGTERM to the parent's group reaches the
parent alone, which sends each child one SIGTERM (a second one would interrupt the child's commit).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from batchscribe.config import ConfigError
from batchscribe.fleet.plan import EXIT_USAGE, ChildPlan, child_options, on_exit, parse_gpus, plan_children
from batchscribe.fleet.summary import fleet_summary
from batchscribe.fleet.wire import encode_job
from batchscribe.output.lock import lock_output
from batchscribe.output.records import now_iso
from batchscribe.output.resume import inspect_output, output_prefix, remove_records, shard_pattern, summary_name
from batchscribe.output.writers import write_summary
from batchscribe.run import RunOptions, RunResult, TooManyErrors
from batchscribe.sink import ProgressCallback, RunProgress, estimate_total
from batchscribe.stops import deferred, stop_signals


class FleetError(RuntimeError):
    """A child failed in a way a restart would not mend; the message names the child and why."""


@dataclass
class _Child:
    plan: ChildPlan
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0  # incarnations started; events of an older one are ignored
    restarts: int = 0
    progress: dict[str, Any] | None = None
    carried: int = 0  # items committed by earlier incarnations in this run (a restart skips them)
    summary: dict[str, Any] | None = None
    error: str | None = None
    code: int | None = None
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))


class Supervisor:
    """One --gpus run over `devices` ("cuda:0", ...; "cpu" in tests). `python`: the interpreter
    the children run (this one)."""

    def __init__(self, inputs: Sequence[str], output_dir: Path, opts: RunOptions, devices: Sequence[str],
                 progress: ProgressCallback | None = None, python: str = sys.executable) -> None:  # fmt: skip
        self.inputs, self.output_dir, self.opts = list(inputs), Path(output_dir), opts
        src = opts.source
        self.children = [_Child(p) for p in plan_children(devices, src.num_shards, src.shard_index)]
        self.prefix = output_prefix(src.num_shards, src.shard_index)
        self.progress, self.python = progress, python
        self.events: queue.Queue[tuple[str, int, int, Any]] = queue.Queue()
        self.stopping = False
        self.start = time.monotonic()
        self.first_record: float | None = None  # seconds after start when a child first reported one
        self.total = estimate_total(self.inputs, src)

    def run(self) -> RunResult:
        start_time = now_iso()
        with lock_output(self.output_dir, f"{self.prefix}-gpus") as lock, stop_signals():
            if self.opts.overwrite:
                lock.exclusive_folder()  # refused now if another writer is live
                try:
                    remove_records(self.output_dir)
                finally:
                    lock.share_folder()
            before = self._committed()
            status, failure = "interrupted", None
            try:
                for child in self.children:
                    self._start(child)
                failure = self._watch()
                status = "complete" if failure is None else f"failed: {failure.plan.device}"
            except KeyboardInterrupt:
                self._stop_all()
                raise
            finally:
                summary = self._summary(status, start_time, before)
                if before["items"] or any(c.progress or c.summary or c.carried for c in self.children):
                    # (a usage error in every child, before any record: nothing is written, as in a plain run)
                    write_summary(self.output_dir, summary, summary_name(self.prefix))
        if failure is not None:
            raise self._failure_error(failure)
        shards = tuple(sorted(set(self._shard_names()) - set(before["names"])))
        return RunResult(self.output_dir, summary, shards)

    # -- children ------------------------------------------------------------------------------

    def _start(self, child: _Child) -> None:
        child.generation += 1
        child.summary = child.error = child.code = None
        opts = child_options(self.opts, child.plan, len(self.children))
        env = dict(os.environ)
        if child.plan.cuda_index is not None:
            # NOTE: one visible GPU per child: no child creates a CUDA context on another's GPU.
            env["CUDA_VISIBLE_DEVICES"] = str(child.plan.cuda_index)  # the child's options say cuda:0
        proc = subprocess.Popen([self.python, "-m", "batchscribe.fleet.child"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                start_new_session=True)  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # The pipe stays open for the child's life: its end of file tells the child the parent died.
        proc.stdin.write(encode_job(self.inputs, self.output_dir, opts))
        proc.stdin.flush()
        child.proc = proc
        rank, gen = child.plan.rank, child.generation
        threading.Thread(target=self._read_messages, args=(proc, rank, gen), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(proc.stderr, child), daemon=True).start()

    def _read_messages(self, proc: subprocess.Popen[bytes], rank: int, gen: int) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.events.put(("message", rank, gen, json.loads(line)))
            except ValueError:
                continue  # not a message (cannot happen: the child's stdout carries only these)
        self.events.put(("exit", rank, gen, proc.wait()))

    def _read_stderr(self, stream: IO[bytes], child: _Child) -> None:
        tag = f"[{child.plan.device} {child.plan.prefix}] "
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            child.stderr.append(line)
            sys.stderr.write(tag + line + "\n")  # warnings (a shard moved aside) reach the user

    def _watch(self) -> _Child | None:
        """Handle events until every child has ended; the child that failed the run, or None."""
        failure: _Child | None = None
        while any(c.proc is not None for c in self.children):
            kind, rank, gen, payload = self._next_event()
            child = self.children[rank]
            if gen != child.generation:
                continue
            if kind == "message":
                self._on_message(child, payload)
                continue
            child.proc, child.code = None, payload
            action = on_exit(payload, child.restarts, self.stopping)
            if action.action == "restart":
                child.restarts += 1
                child.carried = self._carried(child)
                self._start(child)
            elif action.action == "fail" and failure is None:
                failure, self.stopping = child, True
                self._signal_all(signal.SIGTERM)  # the others commit and stop; a rerun resumes
        return failure

    def _next_event(self) -> tuple[str, int, int, Any]:
        # A timeout, so a SIGTERM's handler runs within half a second whatever the platform's locks do.
        while True:
            try:
                return self.events.get(timeout=0.5)
            except queue.Empty:
                continue

    def _on_message(self, child: _Child, message: dict[str, Any]) -> None:
        if "progress" in message:
            child.progress = message["progress"]
            if self.first_record is None and child.progress.get("done"):
                self.first_record = time.monotonic() - self.start
            if self.progress is not None:
                self.progress(self._aggregate())
        elif "summary" in message:
            child.summary = message["summary"]
        elif "error" in message:
            child.error = str(message["error"])

    def _carried(self, child: _Child) -> int:
        """What the child's earlier incarnations committed in this run, so the bar does not go back."""
        done = child.carried + (child.progress or {}).get("done", 0)
        child.progress = None
        return done

    def _signal_all(self, sig: int) -> None:
        for child in self.children:
            if child.proc is not None:
                try:
                    child.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _stop_all(self) -> None:
        """SIGTERM (or Ctrl-C) to the parent: each child gets one SIGTERM, commits and exits."""
        self.stopping = True
        self._signal_all(signal.SIGTERM)
        # NOTE: while waiting, a second SIGTERM to the parent kills it (the handler is one-shot);
        # the children then see their stdin close and stop themselves the same way.
        while any(c.proc is not None for c in self.children):
            kind, rank, gen, payload = self._next_event()
            child = self.children[rank]
            if gen == child.generation:
                if kind == "message":
                    self._on_message(child, payload)
                else:
                    child.proc, child.code = None, payload

    # -- progress and summary ------------------------------------------------------------------

    def _aggregate(self) -> RunProgress:
        reports = [(c, c.progress) for c in self.children if c.progress is not None]
        done = sum(c.carried for c in self.children) + sum(p["done"] for _, p in reports)
        skipped = sum(max(0, p["skipped"] - c.carried) for c, p in reports)
        total = None if self.total is None else max(self.total - skipped, done)
        return RunProgress(done, sum(p["ok"] for _, p in reports), sum(p["errors"] for _, p in reports), skipped,
                           sum(p["audio_seconds"] for _, p in reports), time.monotonic() - self.start, total,
                           max((p["startup_s"] for _, p in reports), default=0.0))  # fmt: skip

    def _committed(self) -> dict[str, Any]:
        """The children's records in the folder before they start (this run's counts are the difference)."""
        totals = [inspect_output(self.output_dir, self.opts.format, c.plan.prefix).totals() for c in self.children]
        keys = ("items", "ok", "errors", "audio_seconds")
        return {**{k: sum(t[k] for t in totals) for k in keys}, "names": self._shard_names()}

    def _shard_names(self) -> list[str]:
        patterns = [shard_pattern(c.plan.prefix) for c in self.children]
        return [p.name for p in self.output_dir.iterdir() if any(r.match(p.name) for r in patterns)]

    def _summary(self, status: str, start_time: str, before: dict[str, Any]) -> dict[str, Any]:
        children = []
        for child in self.children:
            summary = child.summary or _read_json(self.output_dir / summary_name(child.plan.prefix))
            children.append((child.plan, child.restarts, summary))
        return fleet_summary(self.inputs, self.opts, children, before, status, time.monotonic() - self.start,
                             start_time, self.first_record)  # fmt: skip

    def _failure_error(self, child: _Child) -> Exception:
        why = child.error or "\n".join(child.stderr) or f"exit code {child.code}"
        where = f"the --gpus child on {child.plan.device} ({child.plan.prefix})"
        if child.code == EXIT_USAGE:
            return ConfigError(f"{where}: {why}")
        if child.error is not None and "--max-errors" in child.error:
            return TooManyErrors(f"{where}: {why}")
        restarted = f" after {child.restarts} restarts" if child.restarts else ""
        return FleetError(f"{where} failed{restarted}: {why}\nThe records committed so far are kept; fix the "
                          "cause and rerun the same command to resume.")


def gpu_devices(spec: str, device: str = "auto") -> list[str]:
    """`--gpus` -> the children's devices ("cuda:K"); a usage error without CUDA, past the host's
    GPU count, or beside a --device that is not a GPU."""
    if device not in ("auto", "cuda"):
        raise ConfigError(f"--gpus {spec} puts one engine on each GPU, so --device {device} does not apply; "
                          "drop --device (or pass --device cuda)")
    with stop_signals(), deferred():  # a KeyboardInterrupt inside torch's import aborts the process
        import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{k}" for k in parse_gpus(spec, available)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # stopped before its model loaded: no summary; its records are still counted
