#!/usr/bin/env bash
# One device call for a short budget (carry .whl2 .stage/p1s .stage/dec .stage/fa3 .stage/base):
# the wheels and FlashInfer's modules (call_a.sh), tiny.en with random weights of its real shapes
# (`stage_b.sh random`: the real weights do not fit in one call beside the wheels), then
# call_startup_ab.sh (start-up, this tree against BASE_COMMIT's in .stage/base) and TESTS (default:
# Prewarm's GPU tests and one system run). .stage/p1s is .stage/p1 less tinypart_02 and basetok,
# plus tinyshapes.json (`random_weights.py --shapes-of`). Start-up does not depend on the weights'
# values; tests that check transcripts need call_b.sh's real weights.
#   bash benchmarks/device/call_startup_oneshot.sh COMMIT BASE_COMMIT | tail -n 90
set -u
commit=$1; base=$2
mkdir -p .stage && ln -sfn p1s .stage/p1  # what call_a.sh (install.sh) stages
bash benchmarks/device/call_a.sh $commit > $OUT/install.txt 2>&1
bash benchmarks/device/stage_b.sh random
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export TESTS=${TESTS-tests/engine/test_prewarm.py tests/system/test_gpus.py::test_gpus_one_equals_the_plain_run_on_cuda}
bash benchmarks/device/call_startup_ab.sh $commit $base
