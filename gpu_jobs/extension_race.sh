#!/usr/bin/env bash
# The course extension built and loaded by many processes at once from a cold cache, as `make test-gpu`'s suites
# do side by side (issue 44: `labkernels_ext.so: cannot open shared object file` on a fresh H200). 12 processes
# start 0-20 s apart in a fresh TORCH_EXTENSIONS_DIR; midway a source's mtime is bumped, so later arrivals relink
# the library while others load it. Each process loads the extension and checks add_relu on the GPU (or the
# CPU) against torch. RACE_PROCESSES changes the count. Logs to $OUT/extension_race/; prints one line per process and a verdict. Under 4 minutes.
set -u
dest="$OUT/extension_race"
mkdir -p "$dest"
export TORCH_EXTENSIONS_DIR=$(mktemp -d /tmp/labkernels-race-XXXXXX)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
child='
import sys, time, torch
from labkernels.ch01_jit import build, ops
start = time.time()
ops.load()
device = "cuda" if torch.cuda.is_available() else "cpu"
x, y = torch.randn(4099, device=device), torch.randn(4099, device=device)
torch.testing.assert_close(ops.add_relu(x, y), torch.relu(x + y), rtol=0, atol=0)
print(f"process {sys.argv[1]}: loaded {build.LAST_BUILD.path} rebuilt={build.LAST_BUILD.rebuilt} in {time.time() - start:.1f} s")
'
pids=()
n=${RACE_PROCESSES:-12}
for k in $(seq 0 $((n - 1))); do
  if [ "$k" = $((n / 2)) ]; then  # midway: a newer source makes the next arrivals relink
    touch labkernels/csrc/*.cpp
  fi
  timeout 220 python -c "$child" "$k" > "$dest/process_$k.log" 2>&1 &
  pids+=($!)
  sleep $((k % 4 + 1))
done
failed=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; rc=$?
  tail -n 1 "$dest/process_$k.log"
  [ "$rc" = 0 ] || { failed=$((failed + 1)); echo "process $k: rc=$rc"; tail -n 5 "$dest/process_$k.log"; }
done
grep -h "cannot open shared object\|deleted it" "$dest"/process_*.log | sort | uniq -c
echo "extension race: $failed of ${#pids[@]} processes failed"
rm -rf "$TORCH_EXTENSIONS_DIR"
