#!/usr/bin/env bash
# Online-softmax variants, third round (issue 15): the split kernel's exchange as one 64-bit word per chunk.
# About 3 minutes with a cold cache.
set -u
dest="$OUT/softmax_variants3"
mkdir -p "$dest"
timeout 200 python gpu_jobs/softmax_variants3.py "$dest" 2>&1 | tee "$dest/variants3.log" | tail -80
