#!/usr/bin/env bash
# After call_a.sh (carry .stage/p2): assemble tiny.en from its three parts and copy the data to
# ../shared/data. call_b.sh starts with it; w1_variants.sh needs it.
S=$HOME/stage
mkdir -p $S/models/converted/tiny.en && cp $S/tinyjson/* $S/models/converted/tiny.en/
cat .stage/p2/tinypart_00 .stage/p2/tinypart_01 $S/tinypart_02 > $S/models/converted/tiny.en/model.safetensors
mkdir -p ../shared/data && cp -r .stage/p2/data/* ../shared/data/
if [ -d $S/data ]; then cp -r $S/data/* ../shared/data/; fi  # what call A carried (.stage/p1/data)
