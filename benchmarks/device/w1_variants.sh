export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$1 BATCHSCRIBE_CACHE=$HOME/stage/models
cd benchmarks
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
for v in "--decode processes --workers 8" "--decode processes --workers 15" "--decode processes --workers 15 --slots 512"; do
  echo "== $v"; timeout 100 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append --configs auto:auto auto:fp8 $v 2>&1 | grep -E "host seconds|RTFx" | cut -c1-330
done
