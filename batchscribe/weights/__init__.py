"""Model weights: find a Whisper checkpoint by name and load it; convert CTranslate2 models exactly.

Only safetensors are ever loaded. The error classes are the boundary errors the CLI reports
with exit code 2 (it matches them by type name, so keep the names).
"""

from batchscribe.weights.ct2_format import ChecksumError, Ct2FormatError
from batchscribe.weights.hf_folder import ModelFormatError, load_state_dict
from batchscribe.weights.resolve import ModelNotFoundError, resolve_model

__all__ = [
    "ChecksumError",
    "Ct2FormatError",
    "ModelFormatError",
    "ModelNotFoundError",
    "load_state_dict",
    "resolve_model",
]
