"""Can the encoder run beside the decode steps? Device time of the engine's own graphs, alone and
concurrently, on W2's or W4's engine (random bf16 weights):

    python benchmarks/overlap_probe.py --tokenizer-from BASE_HF_FOLDER [--arch large-v3|turbo]
        [--slots 256] [--config auto:fp8] [--sms 32 48 64]

- alone: N replays of the full-bucket decode look, and M replays of the 32-window encoder graph;
- together: the same replays on two streams, with the encoder's stream
  - a plain side stream, then one of low priority beside a high-priority decode stream;
  - a green context of k SMs (torch.cuda.green_contexts when it works, else the driver API through
    ctypes), the steps on the whole GPU or on the other SMs.
Prints each arm's wall time and the gain over running the two one after the other. The encoder
writes its K/V into slot 0 over and over: the figures are device time, not transcripts.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import tempfile
import time
from pathlib import Path

import torch

import w2_large_v3 as w2
from batchscribe.config import EngineOptions
from batchscribe.engine.graphs import warm_up
from batchscribe.engine.setup import resolve_engine
from batchscribe.model.dims import ModelDims


class DriverGreen:
    """A green context of `num_sms` SMs (and optionally one of the rest) through libcuda, for
    torch builds without a usable torch.cuda.green_contexts. Buffers are oversized: the resource
    struct grew across CUDA releases, and every call here passes one resource at a time."""

    RES = 512

    def __init__(self, num_sms: int, device: int = 0):
        cu = ctypes.CDLL("libcuda.so.1")
        self.cu = cu
        dev = ctypes.c_int()
        self._ok(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        whole = ctypes.create_string_buffer(self.RES)
        self._ok(cu.cuDeviceGetDevResource(dev, whole, 1), "cuDeviceGetDevResource")  # 1: SM
        self.total = ctypes.c_uint.from_buffer(whole, 96).value
        part, rest = ctypes.create_string_buffer(self.RES), ctypes.create_string_buffer(self.RES)
        groups = ctypes.c_uint(1)
        self._ok(cu.cuDevSmResourceSplitByCount(part, ctypes.byref(groups), whole, rest, 0, num_sms),
                 "cuDevSmResourceSplitByCount")  # fmt: skip
        self.sms = ctypes.c_uint.from_buffer(part, 96).value
        self.rest_sms = ctypes.c_uint.from_buffer(rest, 96).value
        self.stream = self._stream(part, dev, priority=0)
        self.rest_stream = self._stream(rest, dev, priority=-1) if self.rest_sms else None

    def _stream(self, resource, dev, priority: int) -> torch.cuda.ExternalStream:
        cu = self.cu
        desc, ctx, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self._ok(cu.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, 1), "cuDevResourceGenerateDesc")
        self._ok(cu.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, 1), "cuGreenCtxCreate")  # 1: default stream
        self._ok(cu.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, 1, priority), "cuGreenCtxStreamCreate")
        return torch.cuda.ExternalStream(stream.value)

    @staticmethod
    def _ok(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} returned CUresult {code}")


def torch_green(num_sms: int):
    """torch's own green context's stream, or None with the reason printed."""
    try:
        from torch.cuda import green_contexts as gc

        ctx = gc.GreenContext.create(num_sms=num_sms, device_id=0)
        return ctx, ctx.Stream()  # torch >= 2.11
    except Exception as e:  # noqa: BLE001 (a probe: report and fall back)
        print(f"torch green context ({num_sms} SMs): {type(e).__name__}: {e}", flush=True)
        return None


def _launch(fn, k: int, reset) -> None:
    """The k-th launch of fn on the current stream; with `reset` (the steps), rows are put back
    mid-window every 25 looks."""
    if reset is not None and k % 25 == 0:
        reset()
    fn()


def _on(stream, fn, n: int, reset=None) -> None:
    with torch.cuda.stream(stream):
        for k in range(n):
            _launch(fn, k, reset)


def _together(step_stream, step_graph, n_step: int, enc_stream, enc_graph, n_enc: int, reset) -> float:
    """Both streams' replays, launched interleaved in proportion, from a common start."""
    main = torch.cuda.current_stream()

    def launch() -> None:
        step_stream.wait_stream(main)
        enc_stream.wait_stream(main)
        k_s = k_e = 0
        while k_s < n_step or k_e < n_enc:
            if k_e < n_enc and (k_e * n_step <= k_s * n_enc or k_s >= n_step):
                with torch.cuda.stream(enc_stream):
                    _launch(enc_graph.replay, k_e, None)
                k_e += 1
            else:
                with torch.cuda.stream(step_stream):
                    _launch(step_graph.replay, k_s, reset)
                k_s += 1
        main.wait_stream(step_stream)
        main.wait_stream(enc_stream)

    return timed(launch)


def timed(launch) -> float:
    """Wall seconds of `launch()` with the device drained before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    launch()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--arch", choices=sorted(w2.ARCHS), default="large-v3")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--config", default="auto:fp8", help="attention:cross_kv[:encoder_precision]")
    ap.add_argument("--sms", type=int, nargs="*", default=[32, 48, 64, 80])
    ap.add_argument("--seconds", type=float, default=1.0, help="device seconds per stream and arm")
    args = ap.parse_args()
    w2.ARCH, w2.TOKENS = w2.ARCHS[args.arch], 128 if args.arch == "large-v3" else 32  # W2's, W4's
    dims = ModelDims.from_hf_config(w2.ARCH)
    with tempfile.TemporaryDirectory() as tmp:
        tok = w2.large_v3_tokenizer(args.tokenizer_from, Path(tmp))
    attention, cross_kv, precision = (args.config.split(":") + ["auto"])[:3]
    options = EngineOptions(device="cuda", dtype="bfloat16", batch_size=args.slots, attention=attention,
                            cross_kv=cross_kv, encoder_precision=precision)  # fmt: skip
    config = resolve_engine(options, dims).with_slots(dims)
    engine = w2.scheduler(w2.random_model(config.dtype), tok, config).engine
    state, graphs = engine.slots.state, engine.graphs
    state.running.fill_(True)
    state.sample_begin.fill_(4)
    state.sample_end.fill_(engine.n_ctx)
    # Rows are put back mid-window every 25 looks: the bucket must hold that many looks' steps.
    need = w2.mid_kv() + 26 * engine.steps_per_look
    kv = min([k for k in graphs.kv_buckets if k >= need] or [max(graphs.kv_buckets)])
    step_graph = graphs.graphs[graphs.buckets[-1], kv, False]
    chunk = 32 if 32 in engine.encoder_graphs.graphs else max(engine.encoder_graphs.graphs)
    enc_graph = engine.encoder_graphs.graphs[chunk]

    def reset_positions() -> None:  # keep every row mid-window, inside the bucket
        state.positions.fill_(min(w2.mid_kv(), kv - 26 * engine.steps_per_look))
        state.running.fill_(True)

    reset_positions()
    step_s = timed(lambda: [step_graph.replay() for _ in range(3)]) / 3
    reset_positions()
    enc_s = timed(lambda: [enc_graph.replay() for _ in range(3)]) / 3
    n_step = max(1, round(args.seconds / step_s))
    n_enc = max(1, round(args.seconds / enc_s))
    print(f"engine: {args.arch}, {engine.n_slots} slots, {args.config}, look of {engine.steps_per_look} steps over "
          f"{graphs.buckets[-1]} rows at kv {kv}: {step_s * 1e3:.2f} ms a replay; encoder {chunk} windows: "
          f"{enc_s * 1e3:.2f} ms ({enc_s / chunk * 1e3:.2f} ms/window); {n_step} looks, {n_enc} encodes per arm", flush=True)  # fmt: skip

    def steps(stream, graph=step_graph) -> float:
        return timed(lambda: _on(stream, graph.replay, n_step, reset_positions))

    def encodes(stream, fn=enc_graph.replay) -> float:
        return timed(lambda: _on(stream, fn, n_enc))

    def together(step_stream, enc_stream, steps_graph=step_graph, encoder_graph=enc_graph) -> float:
        return _together(step_stream, steps_graph, n_step, enc_stream, encoder_graph, n_enc, reset_positions)

    results = {}
    default = torch.cuda.current_stream()
    results["steps alone"] = t_steps = steps(default)
    results["encoder alone"] = t_enc = encodes(default)
    serial = t_steps + t_enc
    side, high, low = torch.cuda.Stream(), torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
    results["side stream"] = together(default, side)
    results["priorities (steps high)"] = together(high, low)
    audio = engine.encoder_graphs.audio[chunk]
    slot_ids = engine.encoder_graphs.slot_ids[chunk]

    def capture(fn, stream):
        """fn captured on `stream` (a green context's: its kernels may keep that context's SMs)."""
        warm_up(fn, engine.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            fn()
        torch.cuda.synchronize()
        return graph

    for k in args.sms:
        made = torch_green(k)
        if made is not None:
            results[f"encoder alone, torch green {k}, primary graph"] = encodes(made[1])
        try:
            driver = DriverGreen(k)
        except Exception as e:  # noqa: BLE001
            print(f"driver green context ({k} SMs): {type(e).__name__}: {e}", flush=True)
            continue
        green, rest = driver.stream, driver.rest_stream
        tag = f"green {driver.sms}/{driver.total}"
        results[f"encoder alone, {tag}, primary graph"] = encodes(green)
        results[f"encoder alone, {tag}, eager"] = encodes(green, lambda: engine.encoder(audio, slot_ids))
        try:
            enc_green = capture(lambda: engine.encoder(audio, slot_ids), green)
        except Exception as e:  # noqa: BLE001
            print(f"capture on {tag}: {type(e).__name__}: {e}", flush=True)
            continue
        results[f"encoder alone, {tag}, graph captured there"] = encodes(green, enc_green.replay)
        if rest is None:
            continue
        reset_positions()
        step_rest = capture(lambda: engine.look(graphs.buckets[-1], kv, False), rest)
        results[f"steps alone, rest {driver.rest_sms}, graph captured there"] = steps(rest, step_rest)
        results[f"{tag}: encoder graph there, steps graph on the rest"] = together(rest, green, step_rest, enc_green)
        results[f"{tag}: encoder graph there, steps on the whole GPU (high)"] = together(high, green, encoder_graph=enc_green)
    print(f"\nserial (steps alone + encoder alone): {serial:.3f} s")
    for name, seconds in results.items():
        gain = f"  {serial / seconds:.2f}x of serial" if "alone" not in name else ""
        print(f"{name:<60}{seconds:>8.3f} s{gain}")
    print(json.dumps({"step_ms": step_s * 1e3, "enc_ms": enc_s * 1e3, **results}))


if __name__ == "__main__":
    main()
