"""Whisper's fixed audio and text constants (openai/whisper audio.py, decoding.py)."""

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30  # seconds per window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples per window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
N_AUDIO_CTX = N_FRAMES // 2  # 1500 encoder frames (conv2 has stride 2)
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # 320 samples per encoder frame
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 mel frames per second
TIME_PRECISION = 0.02  # seconds per timestamp token
N_TEXT_CTX = 448

# Fallback thresholds, as openai/whisper transcribe() defaults.
COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
