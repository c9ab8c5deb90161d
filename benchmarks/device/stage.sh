#!/usr/bin/env bash
# Build what the lent H200 needs for the GPU tests and benchmarks, in ignored folders of the checkout
# (docs/GPU_NOTES.md, "Staging recipe"). Run from the repository root, with the dev venv active and
# ../shared/data beside the checkout:
#   bash benchmarks/device/stage.sh
# Then, back to back (the machine keeps $HOME/stage only while it stays warm):
#   run(carry=[".whl2", ".stage/p1"], command="bash benchmarks/device/call_a.sh COMMIT [W2 ARGS...]")
#   run(carry=[".stage/fa3", ".stage/dec"], command="source benchmarks/device/aot_modules.sh")  (the modules
#       call: FlashInfer's prebuilt modules where it loads them, so nothing JIT-builds; skip it without .fiaot)
#   run(carry=[".stage/p2"],          command="bash benchmarks/device/call_b.sh COMMIT [PYTEST ARGS...]")
#   run(carry=[".stage/p3"],          command="bash benchmarks/device/call_c.sh COMMIT")  (train-clean-5 W1)
#   run(carry=[],                     command="bash benchmarks/device/call_w1.sh COMMIT")  (W1, words, prompt)
#   run(carry=[".stage/p3", ".stage/p4"], command="bash benchmarks/device/call_ray.sh COMMIT")  (one GPU actor)
#   run(carry=[".stage/p5"],          command="bash benchmarks/device/call_vad.sh COMMIT")  (--vad on CUDA)
#   run(carry=[".stage/p6"],          command="bash benchmarks/device/call_overlap.sh COMMIT")  (encoder beside steps)
#   run(carry=[".stage/p7"],          command="bash benchmarks/device/call_fp8acc.sh COMMIT")  (fp8 encoder's WER)
# With BEFORE=COMMIT, ab.sh then runs W1/W2 on that commit and this checkout in one call (carry .before).
set -euo pipefail
grep -qx '/.whl2/' .git/info/exclude 2>/dev/null || printf '/.whl2/\n/.fiaot/\n' >> .git/info/exclude
grep -qx '/.before/' .git/info/exclude 2>/dev/null || printf '/.before/\n' >> .git/info/exclude
# BEFORE=COMMIT: that commit's package and benchmarks in .before/, for ab.sh (before/after in one call).
if [ -n "${BEFORE:-}" ]; then
    rm -rf .before && mkdir -p .before && git archive "$BEFORE" batchscribe benchmarks | tar -x -C .before
    git rev-parse --short "$BEFORE" > .before/COMMIT
fi

# cp312 wheels the device image lacks (FlashInfer whole: a first run there JIT-compiles its kernels).
mkdir -p .whl2
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl2 soundfile cffi pycparser soxr jiwer rapidfuzz flashinfer-python==0.6.18.post1 \
    apache-tvm-ffi==0.1.15.post2 miniaudio orjson

# Real tiny.en (converted here from its PyPI package) in three parts, the data the tests read.
python -c "from pathlib import Path; from batchscribe.weights import resolve_model as r; [r(n, cache_dir=Path('.pytest_models')) for n in ('tiny.en', 'base')]"
tiny=.pytest_models/converted/tiny.en
rm -rf .stage && mkdir -p .stage/p1/basetok .stage/p1/tinyjson .stage/p1/aot .stage/p1/data/librispeech .stage/p2/data/librispeech .stage/p2/data/misc
cp .pytest_models/converted/base/tokenizer.json .stage/p1/basetok/
cp "$tiny"/*.json .stage/p1/tinyjson/
# Three parts, the last (28 MiB) with call A: p2's two parts and the test-other rows then leave the
# checkout (~3.5 MiB of 4 KiB blocks, as the device tool counts it) room under a call's 64 MiB.
size=$(stat -c %s "$tiny/model.safetensors"); last=$((28 << 20)); first=$(((size - last + 1) / 2))
head -c $first "$tiny/model.safetensors" > .stage/tinypart_00
# dd, not tail | head: head closing the pipe early is a SIGPIPE that pipefail turns into a failed stage.
dd if="$tiny/model.safetensors" of=.stage/tinypart_01 iflag=skip_bytes,count_bytes skip=$first count=$((size - last - first)) bs=1M status=none
tail -c $last "$tiny/model.safetensors" > .stage/tinypart_02
mv .stage/tinypart_02 .stage/p1/ && mv .stage/tinypart_00 .stage/tinypart_01 .stage/p2/
# The two parts alone (hard links), for calls that carry something beside them (call_startup_ab.sh).
mkdir -p .stage/p2t && ln .stage/p2/tinypart_00 .stage/p2/tinypart_01 .stage/p2t/
# The base tokenizer alone (what the random-weight benchmarks need), for one-shot calls that carry
# .whl2 and the modules beside it (call_profile.sh).
mkdir -p .stage/p1b/basetok && ln .stage/p1/basetok/tokenizer.json .stage/p1b/basetok/
cp ../shared/data/librispeech/test-other-subset-00000-of-00001.parquet .stage/p2/data/librispeech/
# The GPU feature tests' test-clean rows ride with call A (p2 is near the 64 MiB a call carries).
cp ../shared/data/librispeech/test-clean-subset-00000-of-00001.parquet .stage/p1/data/librispeech/
mkdir -p .stage/p1/data/misc && cp ../shared/data/misc/jfk.flac .stage/p1/data/misc/  # p2 is at a call's 64 MiB
# W1's utterances as BENCHMARKS.md measured its peer (~13 s each): the first 100 of train-clean-5.
mkdir -p .stage/p3/data/librispeech
python -c "import pyarrow.parquet as pq; pq.write_table(pq.read_table('../shared/data/librispeech/train-clean-5-00000-of-00008.parquet').slice(0, 100), '.stage/p3/data/librispeech/train-clean-5-first100.parquet', row_group_size=64)"
# FlashInfer's modules built by earlier calls, unpacked into .fiaot (call_b.sh returns the decode
# ones as aot.tgz, call_fa3.sh the encoder's FA3 ones as fa3.tgz): no JIT. They ride in .stage/dec
# and .stage/fa3 (~9 + 7 MiB with both dtypes: p1 and .whl2 leave no room for them in call A), in
# the call right after call A (the modules call).
mkdir -p .stage/fa3 .stage/dec
find .fiaot -name "batch_decode*.so" -exec cp {} .stage/dec/ \; 2>/dev/null || true
find .fiaot -name "batch_prefill*sm90.so" -exec cp {} .stage/fa3/ \; 2>/dev/null || true
# Ray for call_ray.sh (the image has none; its cp312 wheel is ~79 MB): the wheel less its Java jars,
# RLlib and the dashboard's web build, with the jsonschema packages the image lacks, one xz tarball.
mkdir -p .stage/p4 && rm -rf /tmp/bs_ray && mkdir -p /tmp/bs_ray/x
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d /tmp/bs_ray \
    "ray==$(python -c 'import ray; print(ray.__version__)')" jsonschema jsonschema-specifications referencing rpds-py
for w in /tmp/bs_ray/*.whl; do unzip -q -o "$w" -d /tmp/bs_ray/x; done
rm -rf /tmp/bs_ray/x/ray/jars /tmp/bs_ray/x/ray/rllib /tmp/bs_ray/x/ray/dashboard/client/build
tar cJf .stage/p4/ray.tar.xz -C /tmp/bs_ray/x .
# --vad for call_vad.sh: silero-vad's wheel (it ships its model; the image has none) and the long-form files.
mkdir -p .stage/p5/data
pip download -q --no-deps --only-binary=:all: -d .stage/p5 "silero-vad==$(python -c 'from importlib.metadata import version; print(version("silero-vad"))')"
cp -r ../shared/data/longform .stage/p5/data/
# Small things for calls that need no audio (call_overlap.sh, W4's --tokens-from): base's tokenizer,
# the cuda-bindings wheels torch's green contexts import, train-clean-5's texts and durations.
mkdir -p .stage/p6/data && cp -r .stage/p1/basetok .stage/p6/
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d .stage/p6 "cuda-bindings>=13.0,<13.1" cuda-pathfinder
python -c "import pyarrow as pa, pyarrow.parquet as pq, glob; pq.write_table(pa.concat_tables([pq.read_table(f, columns=['id', 'text', 'duration_s']) for f in sorted(glob.glob('../shared/data/librispeech/train-clean-5-*.parquet'))]), '.stage/p6/data/train-clean-5-text.parquet')"
# fp8_accuracy.py's second set for call_fp8acc.sh: train-clean-5's shard 0 (45 MB, a call of its own).
mkdir -p .stage/p7/data/librispeech && cp ../shared/data/librispeech/train-clean-5-00000-of-00008.parquet .stage/p7/data/librispeech/
sha256sum "$tiny/model.safetensors"
du -sb .whl2 .stage/p1 .stage/p2 .stage/p3 .stage/p4 .stage/p5 .stage/p6 .stage/p7  # each call carries at most 64 MiB with the checkout
