#!/usr/bin/env bash
# Runs GPU jobs on a two-GPU machine: the jobs named in $1 one after another on GPU 0, those in $2 on GPU 1,
# both lanes at once. Each job is gpu_jobs/<name>.sh; its log and files land in $OUT/work, which comes back
# as one archive (the device returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
out=${OUT:?OUT must name the output folder}
mkdir -p "$out/work"
run_lane() {
  local gpu=$1; shift
  for job in "$@"; do
    local start=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpu OUT="$out/work" bash "gpu_jobs/$job.sh" > "$out/work/$job.log" 2>&1
    echo "== $job on GPU $gpu: rc=$? in $((SECONDS - start)) s"
  done
}
command -v python >/dev/null || ln -sf "$(command -v python3)" /usr/local/bin/python
nvidia-smi --query-gpu=name,memory.total --format=csv
run_lane 0 $1 > "$out/work/lane0.log" 2>&1 &
run_lane 1 ${2:-} > "$out/work/lane1.log" 2>&1 &
wait
cat "$out/work/lane0.log" "$out/work/lane1.log"
for log in "$out"/work/*.log; do
  case $log in */lane*.log) continue ;; esac
  echo "---- $(basename "$log") (tail)"; tail -n 25 "$log"
done
tar czf "$out/results.tgz" -C "$out" work && rm -rf "$out/work"
