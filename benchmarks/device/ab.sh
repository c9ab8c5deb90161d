#!/usr/bin/env bash
# Before/after on one machine: a benchmark on the tree staged in .before/ (stage.sh with BEFORE=COMMIT)
# and on this checkout, alternating, ROUNDS times; each run prints its commit. After call_a.sh (wheels)
# and, for W1, stage_b.sh / call_b.sh (tiny.en and the data). Carry .before (and what the benchmark needs).
#   bash benchmarks/device/ab.sh AFTER_COMMIT w2 2 "--tokenizer-from \$HOME/stage/basetok --windows 1024 --slots 512 --configs auto:fp8 --no-append --peer-batch"
#   bash benchmarks/device/ab.sh AFTER_COMMIT w1 2 "--parquet P --replicate 10 --configs auto:auto --no-append --peer-batch"
# The last argument is passed to the benchmark as is ($HOME is expanded); PEER="--peer-batch 256" is
# added to the last round's run of this checkout only, so the peer is measured once, in the same call.
set -u
source benchmarks/device/env.sh
after=$1 kind=$2 rounds=$3 args=$4
before=$(cat .before/COMMIT)
program=$([ "$kind" = w2 ] && echo w2_large_v3.py || echo w1_tiny.py)
pattern=$([ "$kind" = w2 ] && echo "^batchscribe|^Whisper generate|ratio|step at" || echo "RTFx|^batchscribe|transformers bs|ratio|capture")
export BATCHSCRIBE_CACHE=$HOME/stage/models
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    if [ $side = before ]; then tree=$PWD/.before commit=$before; else tree=$PWD commit=$after; fi
    extra=""; [ "$r" = "$rounds" ] && [ $side = after ] && extra=${PEER:-}
    echo "== round $r: $side ($commit) $extra"
    (cd "$tree/benchmarks" && PYTHONPATH=/tmp/site:$tree BATCHSCRIBE_COMMIT=$commit timeout 280 python3 $program $(eval echo "$args") $extra) \
      > "$OUT/${kind}_${side}_$r.txt" 2>&1
    grep -E "$pattern" "$OUT/${kind}_${side}_$r.txt" | cut -c1-300
  done
done
