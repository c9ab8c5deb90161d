#!/usr/bin/env bash
# W1 variants without the peer (after call_a.sh installed the wheels and call_b.sh staged tiny.en
# and the data): decode in processes or threads, in-flight depth, switch interval, slots.
#   bash benchmarks/device/w1_variants.sh COMMIT "VARIANT ARGS" ...
source benchmarks/device/env.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$1 BATCHSCRIBE_CACHE=$HOME/stage/models
shift
cd benchmarks
P=${P:-../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet}  # env P: another W1 Parquet
for v in "$@"; do
  echo "== $v"; timeout 100 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append $v 2>&1 | grep -E "host seconds|RTFx|device busy|timeline" | cut -c1-420
done
