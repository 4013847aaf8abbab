#!/usr/bin/env bash
# Runs GPU jobs (gpu_jobs/<name>.sh, or an experiment's experiments/<name>.sh) and packs their logs and files
# into one archive, $OUT/results.tgz.
# Usage: OUT=folder gpu_jobs/run_all.sh "jobs for GPU 0" ["jobs for GPU 1"]
# With one GPU the second list runs after the first. BUDGET_S (default 540) bounds the whole run: a job is
# cut off when the budget runs out, and the archive is still written.
set -u
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
out=${OUT:?OUT must name the output folder}
budget=${BUDGET_S:-540}
mkdir -p "$out/work"
command -v python >/dev/null || ln -sf "$(command -v python3)" /usr/local/bin/python
nvidia-smi --query-gpu=name,memory.total --format=csv
gpus=$(nvidia-smi -L | wc -l)
run_lane() {
  local gpu=$1; shift
  for job in "$@"; do
    local left=$((budget - 15 - SECONDS))
    if [ "$left" -lt 20 ]; then echo "== $job skipped: budget spent"; continue; fi
    local start=$SECONDS
    local script="gpu_jobs/$job.sh"
    [ -e "$script" ] || script="experiments/$job.sh"
    CUDA_VISIBLE_DEVICES=$gpu OUT="$out/work" timeout "$left" bash "$script" > "$out/work/$job.log" 2>&1
    echo "== $job on GPU $gpu: rc=$? in $((SECONDS - start)) s"
  done
}
if [ "$gpus" -ge 2 ]; then
  run_lane 0 $1 > "$out/work/lane0.log" 2>&1 &
  run_lane 1 ${2:-} > "$out/work/lane1.log" 2>&1 &
  wait
else
  run_lane 0 $1 ${2:-} > "$out/work/lane0.log" 2>&1
  touch "$out/work/lane1.log"
fi
cat "$out/work/lane0.log" "$out/work/lane1.log"
for log in "$out"/work/*.log; do
  case $log in */lane*.log) continue ;; esac
  echo "---- $(basename "$log") (tail)"; tail -n 30 "$log"
done
tar czf "$out/results.tgz" -C "$out" work && rm -rf "$out/work"
