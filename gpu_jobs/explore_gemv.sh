set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout -k 5 400 python experiments/weight_gemv.py --out $OUT --budget 230 2>&1 | tee $OUT/gemv_log.txt | grep -v "^  " 
timeout -k 5 200 python experiments/compile_host.py --out $OUT 2>&1 | grep -v USDT | tee $OUT/compile_log.txt
