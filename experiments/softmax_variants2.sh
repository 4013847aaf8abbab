#!/usr/bin/env bash
# Online-softmax variants, second round (issue 15): prefetching persistent rows, the split kernel without its
# sync (an upper bound), and a persistent split kernel that overlaps its wait with the next chunk's load.
# About 3.5 minutes with a cold cache.
set -u
dest="$OUT/softmax_variants2"
mkdir -p "$dest"
timeout 240 python experiments/softmax_variants2.py "$dest" 2>&1 | tee "$dest/variants2.log" | tail -150
