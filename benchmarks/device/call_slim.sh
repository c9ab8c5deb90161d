#!/usr/bin/env bash
# stage_slim.sh's two calls. 1: install the wheels, stage tiny.en's first parts, compile bytecode.
# 2: assemble tiny.en, install silero-vad, run the GPU tests (the arguments go to pytest; default:
# the engine's, the prefill graph's and --vad's first), with each test's duration.
set -u
S=$HOME/stage
if [ "$1" = 1 ]; then
    mkdir -p $S && cp -r .dev1/tiny $S/
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev1/whl/*.whl 2>&1 | tail -2
    source benchmarks/device/env.sh
    python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
    exit 0
fi
shift
[ -d .dev2/whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev2/whl/*.whl 2>&1 | tail -2
source benchmarks/device/env.sh
M=$S/models/converted/tiny.en
mkdir -p $M ../shared/data && cp $S/tiny/*.json $M/
cat $S/tiny/tinypart_00 $S/tiny/tinypart_01 .dev2/tinypart_02 > $M/model.safetensors
cp -r .dev2/data/* ../shared/data/
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_CACHE=$S/models BATCHSCRIBE_TEST_CACHE=$S/models
[ $# -gt 0 ] || set -- tests/engine/test_graph_replay_options.py tests/engine/test_engine.py tests/audio/test_vad_model.py tests/engine
timeout ${TEST_TIMEOUT:-280} python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=150 --durations=30 \
    --continue-on-collection-errors "$@" > $OUT/tests.txt 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error|PASSED|FAILED|ERROR" $OUT/tests.txt | tail -15 | cut -c1-300
