"""Marks the GPU tests share: `gpu` (skipped without CUDA) and `needs_flashinfer` (the gpu extra)."""

from __future__ import annotations

import pytest
import torch

from batchscribe.attention.flashinfer import flashinfer_available

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
gpu = [pytest.mark.gpu, needs_cuda]  # as a module's pytestmark
needs_flashinfer = pytest.mark.skipif(not flashinfer_available(), reason="needs flashinfer-python (the gpu extra)")
