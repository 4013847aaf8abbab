set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout -k 5 250 python gpu_jobs/int8_gemv.py --out $OUT > $OUT/int8_gemv.log 2>&1
echo "int8_gemv rc=$?"; grep -E "impl=|tuner" $OUT/int8_gemv.log | sed -E 's/dtype=\S+ //; s/err=\S+ //' | cut -c1-330; tail -1 $OUT/int8_gemv.log
