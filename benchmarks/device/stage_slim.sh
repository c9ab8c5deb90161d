#!/usr/bin/env bash
# The least the GPU tests of the engine need, for a session with little device time: two calls
# back to back, no FlashInfer (nothing to JIT-build; the engine's auto kernels fall back to Triton
# and SDPA), tiny.en in two parts and test-other's first 40 rows (the `utterances` fixture):
#   bash benchmarks/device/stage_slim.sh
#   run(carry=[".dev1"], command="bash benchmarks/device/call_slim.sh 1")
#   run(carry=[".dev2"], command="bash benchmarks/device/call_slim.sh 2 [PYTEST ARGS...]")
set -euo pipefail
grep -qx '/.dev1/' .git/info/exclude 2>/dev/null || printf '/.dev1/\n/.dev2/\n' >> .git/info/exclude
rm -rf .dev1 .dev2 && mkdir -p .dev1/whl .dev1/tiny .dev2/data/librispeech .dev2/data/misc
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d .dev1/whl soundfile cffi pycparser soxr jiwer rapidfuzz miniaudio
python -c "from pathlib import Path; from batchscribe.weights import resolve_model as r; r('tiny.en', cache_dir=Path('.pytest_models'))"
tiny=.pytest_models/converted/tiny.en
cp "$tiny"/*.json .dev1/tiny/
split -n 3 -d "$tiny/model.safetensors" .dev1/tiny/tinypart_ && mv .dev1/tiny/tinypart_02 .dev2/
# The first 40 rows (the `utterances` fixture) and the rows the system tests cut clips from.
python - <<'PY'
import numpy as np, pyarrow.parquet as pq
from tests.system.runs import CLIP_IDS
t = pq.read_table('../shared/data/librispeech/test-other-subset-00000-of-00001.parquet')
ids = np.array(t['id'].to_pylist())
pq.write_table(t.filter((np.arange(len(ids)) < 40) | np.isin(ids, CLIP_IDS)), '.dev2/data/librispeech/test-other-subset-00000-of-00001.parquet')
PY
cp ../shared/data/misc/jfk.flac .dev2/data/misc/
# silero-vad (11 MB: --vad's GPU tests) rides with the second call, which has the room.
pip download -q --no-deps --only-binary=:all: -d .dev2/whl silero-vad
du -sh .dev1 .dev2
