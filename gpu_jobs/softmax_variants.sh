#!/usr/bin/env bash
# Online-softmax variants on wide rows against copy bandwidth (issue 15), about 4 minutes with a cold cache.
set -u
dest="$OUT/softmax_variants"
mkdir -p "$dest"
timeout 280 python gpu_jobs/softmax_variants.py "$dest" 2>&1 | tee "$dest/variants.log" | tail -120
