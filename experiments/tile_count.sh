#!/usr/bin/env bash
# experiments/tile_count.py timed, then each of its kernels once under ncu (occupancy, warp states). ~2 min.
set -u
export PYTHONPATH=$PWD/experiments:$PWD
mkdir -p "$OUT/tile_count"
timeout 150 python experiments/tile_count.py
echo "timed: rc=$?"
ncu=$(python -c "import labkernels.profile as p; print(p.ncu_path() or '')")
[ -z "$ncu" ] && { echo "no ncu"; exit 0; }
# 9 kernels compile and launch, one more full grid is checked, then --once launches the 9 again: profile those
timeout 240 "$ncu" --clock-control none --kernel-name regex:"_matmul_tiles|_sk_tail_kernel" --launch-skip 10 \
  --launch-count 9 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats python experiments/tile_count.py --once > "$OUT/tile_count/ncu.txt" 2>&1
echo "ncu: rc=$?"
grep -E "^  _|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit (Registers|Shared)|Grid Size|Stall" "$OUT/tile_count/ncu.txt" | head -150
