"""Decoded audio to the GPU from the decode threads, so the engine's thread never copies samples.

Without it the engine packs each admission group's samples into a pinned buffer itself: one
memcpy of every sample under the GIL (~0.4 s of a 1.9 s W1 run on the H200, docs/GPU_NOTES.md).
Here the thread that decoded an item copies it to the device on a stream of its own; the copy
from pageable memory returns once the samples are on their way (the driver stages them through
its own pinned buffers), and the engine's admission then only concatenates device tensors.
"""

from __future__ import annotations

import threading

import numpy as np
import torch


class DeviceUpload:
    """Callable for `decode_stream(transform=...)`: [n] float32 samples -> the same on `device`.

    Items longer than `max_samples` stay on the host (the engine packs them as before), so a few
    hour-long files cannot take the device memory the decoder's slots were sized against.
    """

    def __init__(self, device: torch.device, max_samples: int, pinned: bool = True):
        if device.type != "cuda":
            raise ValueError(f"DeviceUpload copies to a CUDA device, not {device}")
        self.device, self.max_samples, self.pinned = device, max_samples, pinned
        # The stream the engine reads the samples on: a freed tensor's memory is reused only after
        # the work queued there by then is done (record_stream).
        self.consumer = torch.cuda.current_stream(device)
        self._local = threading.local()  # each decode thread's own copy stream

    def __call__(self, audio: np.ndarray) -> torch.Tensor | np.ndarray:
        if audio.shape[0] > self.max_samples or audio.shape[0] == 0:
            return audio
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            if self.pinned:
                # Through a pinned block of torch's caching host allocator: the copy is one DMA
                # the driver does not stage. (A copy from pageable memory is staged by the calling
                # thread inside the driver, which seemed to stall the engine's own CUDA calls.)
                host = torch.empty(audio.shape[0], dtype=torch.float32, pin_memory=True)  # [n]
                host.copy_(torch.from_numpy(audio))
                out = torch.empty(audio.shape[0], dtype=torch.float32, device=self.device)  # [n]
                out.copy_(host, non_blocking=True)  # the allocator keeps `host` until it is done
            else:
                out = torch.from_numpy(audio).to(self.device)  # [n] float32
            # NOTE: this thread waits for its own copy, so the tensor is complete for any stream
            # that reads it next and the engine never waits for it.
            stream.synchronize()
        out.record_stream(self.consumer)
        return out
