"""engine/prewarm.py: the GPU libraries' first calls in a thread beside the model load."""

from __future__ import annotations

import pytest
import torch

from batchscribe.config import EngineOptions
from batchscribe.engine.prewarm import Prewarm, _touch_libraries
from batchscribe.engine.setup import resolve_engine
from batchscribe.model.dims import ModelDims
from tests.marks import gpu

TINY = ModelDims(n_mels=80, n_vocab=51864, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                 n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)  # fmt: skip


def test_on_the_cpu_no_thread_is_started() -> None:
    warm = Prewarm(resolve_engine(EngineOptions(device="cpu"), TINY), TINY)
    assert warm.thread is None
    warm.join()  # joining nothing is fine, and so is joining twice
    warm.join()


@pytest.mark.gpu
@gpu[1]
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_library_calls_run_on_cuda(dtype: str) -> None:
    """Called directly: Prewarm's thread swallows errors (the engine's own warm-up reports them), so
    this is where a broken call would show."""
    config = resolve_engine(EngineOptions(device="cuda", dtype=dtype), TINY)
    _touch_libraries(config.device, config.dtype, TINY, fused=config.encoder != "eager")
    warm = Prewarm(config, TINY)
    assert warm.thread is not None
    warm.join()
    assert warm.thread is None
    assert torch.cuda.is_initialized()
