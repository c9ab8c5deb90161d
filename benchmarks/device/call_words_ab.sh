#!/usr/bin/env bash
# Device call after call_a.sh, the modules (aot_modules.sh) and stage_b.sh, carrying .stage/base:
# another commit's tree (`rm -rf .stage/base && mkdir -p .stage/base && git archive BASE | tar -x -C
# .stage/base`). Issue 20's cost of word timestamps before and after a change, on one machine: W1
# (test-other x10, no peer) without and with --word-timestamps, this tree's and the base's,
# alternated in fresh processes, ROUNDS times (default 2); this tree's words also with each of
# VARIANTS, W1 arguments separated by ';' (default "--align-hold 0;--align-hold 6": collects a
# partly filled alignment batch may wait).
# Each run's whole output is in $OUT/LABEL.txt. BASE_COMMIT "-" runs this tree alone (no .stage/base:
# the call then has room to carry .stage/p2 and run stage_b.sh first).
#   bash benchmarks/device/call_words_ab.sh COMMIT BASE_COMMIT
set -u
source benchmarks/device/env.sh
commit=$1; base=$2
S=$HOME/stage
export BATCHSCRIBE_CACHE=$S/models BATCHSCRIBE_TEST_CACHE=$S/models
P=$PWD/../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
w1() {  # TREE COMMIT LABEL W1-ARGS...
    local tree=$1 at=$2 label=$3; shift 3
    (cd $tree/benchmarks && PYTHONPATH=/tmp/site:$tree BATCHSCRIBE_COMMIT=$at \
        timeout ${LIMIT:-90} python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append "$@") > $OUT/$label.txt 2>&1
    # One line per run (a call brings back only a few files): throughput, the pass's counters, and
    # the host stages that tell a run slowed by the machine (wait_input: the decode threads) apart.
    echo "$label: $(grep -E "RTFx" $OUT/$label.txt | head -1 | cut -c1-80)" \
        "$(grep -oE "'(align[a-z_]*|wait_input|finish)': [0-9.]+" $OUT/$label.txt | tr '\n' ' ')" | tee -a $OUT/summary.txt
}
# Untimed first: on a machine without FlashInfer's prebuilt modules (aot_modules.sh) the first run
# JIT-compiles them, past the rounds' 90 s limit.
LIMIT=300 w1 $PWD $commit warm_up --word-timestamps
for r in $(seq ${ROUNDS:-2}); do
    [ "$base" = - ] || w1 $PWD/.stage/base $base base_plain_$r --configs auto:auto
    w1 $PWD $commit new_plain_$r --configs auto:auto
    [ "$base" = - ] || w1 $PWD/.stage/base $base base_words_$r --word-timestamps
    w1 $PWD $commit new_words_$r --word-timestamps
    IFS=';' read -ra variants <<< "${VARIANTS---align-hold 0;--align-hold 6}"
    for v in "${variants[@]}"; do
        w1 $PWD $commit "new_words_$(echo $v | tr -d ' -')_$r" --word-timestamps $v
    done
done
# PROFILE=N: one more words run under torch.profiler, its top N host ops and kernels printed here
# (stdout comes back whole; its file may not: a call returns only ~8 files).
if [ "${PROFILE:-0}" -gt 0 ]; then
    LIMIT=200 w1 $PWD $commit new_words_profile --word-timestamps --profile $PROFILE
    grep -E -A$((PROFILE + 4)) "=== .*(host ops|device kernels)" $OUT/new_words_profile.txt | cut -c1-160
    grep "device busy" $OUT/new_words_profile.txt | head -1
fi
# Last, so that it survives the output's 12,000-character tail: each run against the plain run of
# its tree and round (a variant against this tree's), with the host stages that tell a slowed
# round apart.
python3 - "$OUT/summary.txt" <<'PY'
import re
import sys

runs = {}
for line in open(sys.argv[1]):
    label = line.split(":", 1)[0]
    rtfx = re.search(r"RTFx (\d+)", line)
    if rtfx:
        stages = dict(re.findall(r"'(wait_input|finish|align_wait|align_sync_s)': ([0-9.]+)", line))
        runs[label] = (int(rtfx.group(1)), stages)
for label, (rtfx, stages) in runs.items():
    tree, _, rest = label.partition("_")
    plain = runs.get(f"{tree}_plain_{rest.rsplit('_', 1)[-1]}")
    against = f"{100 * (rtfx / plain[0] - 1):+6.1f} %" if plain and "plain" not in rest else ""
    print(f"{label:<28} RTFx {rtfx:>6} {against:>9}  " + " ".join(f"{k} {v}" for k, v in stages.items()))
PY
