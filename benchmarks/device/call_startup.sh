#!/usr/bin/env bash
# Device call right after call_a.sh (carry .stage/p2): is start-up slower on a VM that has run the GPU
# suite (issue 17: <= 2.5 s)? startup_profile.py cold twice on the fresh VM, then the GPU suite, then
# startup_profile.py cold twice again and once with --cprofile, each with the host line. SUITE=0
# skips the suite (and the profiles after it but the --cprofile one): start-up's phases alone.
#   bash benchmarks/device/call_startup.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
bash benchmarks/device/stage_b.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
profile() {  # $1: a label; the rest: startup_profile.py's flags
    local label=$1; shift
    (cd benchmarks && timeout 90 python3 startup_profile.py --parquet $P --rows 3 "$@") > $OUT/startup_$label.txt 2>&1
    echo "== $label ($(cut -d' ' -f1-3 /proc/loadavg), up $(cut -d' ' -f1 /proc/uptime) s)"; head -${LINES_SHOWN:-26} $OUT/startup_$label.txt | cut -c1-160
}
profile fresh1
profile fresh2
if [ "${SUITE:-1}" = 1 ]; then
timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -m gpu --continue-on-collection-errors tests > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt | cut -c1-200
pkill -f -E "raylet|gcs_server|ray::|dashboard" 2>/dev/null || true
echo "after the suite:"; ps -eo pid,pcpu,etime,args --sort=-pcpu --no-headers | grep -v -E "ps -eo|grep" | head -4 | cut -c1-120
echo "caches: $(du -sh $HOME/.triton/cache 2>/dev/null) $(du -sh $HOME/.cache/flashinfer 2>/dev/null)"
profile suite1
profile suite2
fi
LINES_SHOWN=50 profile suite_cprofile --cprofile
