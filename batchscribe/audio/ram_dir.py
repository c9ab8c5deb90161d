"""RAM-backed temporary storage, where the machine has one."""

from __future__ import annotations

import os

# /dev/shm where it is writable, else None (the system's temporary folder): encoded bytes on their
# way to libsndfile (decode), decoded audio on its way back from worker processes (pool).
RAM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

__all__ = ["RAM_DIR"]
