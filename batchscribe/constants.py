"""Whisper's fixed audio and text constants (openai/whisper audio.py, decoding.py)."""

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30  # seconds per window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples per window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
N_AUDIO_CTX = N_FRAMES // 2  # 1500 encoder frames (conv2 has stride 2)
TIME_PRECISION = 0.02  # seconds per timestamp token

# Fallback thresholds, as openai/whisper transcribe() defaults.
COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
