#!/usr/bin/env bash
# After call_a.sh (carry .stage/p2): assemble tiny.en from its three parts and copy the data to
# ../shared/data. call_b.sh starts with it; w1_variants.sh needs it. PARTS: where the first two
# parts are (default .stage/p2; call_startup_ab.sh passes .stage/p2t, the parts without p2's data),
# or `random`: weights of tiny.en's real shapes from call A's tinyshapes.json (.stage/p1s), for a
# call with no room for the parts (call_startup_oneshot.sh).
S=$HOME/stage
parts=${1:-.stage/p2}
D=$S/models/converted/tiny.en
mkdir -p $D && cp $S/tinyjson/* $D/
if [ "$parts" = random ]; then
    PYTHONPATH=/tmp/site python3 benchmarks/device/random_weights.py --from $S/tinyshapes.json --out $D/model.safetensors
else
    cat $parts/tinypart_00 $parts/tinypart_01 $S/tinypart_02 > $D/model.safetensors
fi
mkdir -p ../shared/data
if [ -d $parts/data ]; then cp -r $parts/data/* ../shared/data/; fi
if [ -d $S/data ]; then cp -r $S/data/* ../shared/data/; fi  # what call A carried (.stage/p1/data)
