"""batchscribe: offline batch transcription with Whisper-family models."""

__version__ = "0.1.0"
