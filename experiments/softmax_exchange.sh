#!/usr/bin/env bash
# Online softmax, split rows (issue 15): the exchange's cost and cheaper ways to wait for a row's chunks.
# About 2.5 minutes with a cold cache.
set -u
dest="$OUT/softmax_exchange"
mkdir -p "$dest"
timeout 200 python experiments/softmax_exchange.py "$dest" 2>&1 | tee "$dest/exchange.log" | tail -120
