#!/usr/bin/env bash
# experiments/tuning_cost.py --ranks: each kept config of chapter 03's tiled matmul timed alone, in alternating
# rounds, at 1536^3 (with configs near its pick) and 4096 x 512 x 4096.
set -u
timeout 200 python experiments/tuning_cost.py --ranks 2>&1 | grep -v Warning
