"""What each GPU library costs a fresh process the first time it is used (issue 17's start-up):
the steps Prewarm (engine/prewarm.py) runs in a thread beside the model load, here one after the
other in this process, each synchronised, so each line is that library's own loading.

    python benchmarks/startup_libs.py            (run it in several fresh processes: the first
                                                  after boot also reads the libraries from disk)
    FLASHINFER_CUDA_ARCH_LIST=9.0 python benchmarks/startup_libs.py

Steps: import torch; CUDA's context; Prewarm's own calls (`prewarm.library_steps`: cuBLAS, cuFFT,
cuDNN, SDPA, then, after `import triton`, the fused encoder's add_norm kernel: a build, or a load
from Triton's cache), at tiny.en's shapes in float16; FlashInfer's import (it reads every device's
capability at import unless FLASHINFER_CUDA_ARCH_LIST is set). Steps after a failed one still run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
T0 = time.perf_counter()
import torch  # noqa: E402

IMPORT_TORCH = time.perf_counter() - T0


def main() -> None:
    from batchscribe.engine.prewarm import library_steps
    from batchscribe.model.dims import ModelDims

    print(f"torch {torch.__version__}; FLASHINFER_CUDA_ARCH_LIST={os.environ.get('FLASHINFER_CUDA_ARCH_LIST')}")
    print(f"{'import torch':<34} {IMPORT_TORCH:6.3f} s")
    if not torch.cuda.is_available():
        print("no CUDA here: nothing more to time")
        return
    dev = torch.device("cuda")
    tiny = ModelDims(n_mels=80, n_vocab=51864, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                     n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)  # fmt: skip
    prewarm = library_steps(dev, torch.float16, tiny, fused=True)  # Prewarm's own calls, in its order
    libraries = [step for step in prewarm if not step[0].startswith("Triton")]
    kernels = [step for step in prewarm if step[0].startswith("Triton")]  # none where Triton is missing
    steps = [("CUDA context", lambda: torch.empty(1, device=dev)), *libraries,
             ("import triton", lambda: __import__("triton")), *kernels,
             ("import flashinfer", lambda: __import__("flashinfer"))]  # fmt: skip
    total = 0.0
    for name, step in steps:
        t = time.perf_counter()
        try:
            step()
            torch.cuda.synchronize()
            note = ""
        except Exception as exc:  # noqa: BLE001  (a missing library is reported, the rest still timed)
            note = f"  failed: {type(exc).__name__}: {str(exc)[:120]}"
        seconds = time.perf_counter() - t
        total += seconds
        print(f"{name:<34} {seconds:6.3f} s{note}", flush=True)
    print(f"{'all after import torch':<34} {total:6.3f} s")


if __name__ == "__main__":
    main()
