"""Online softmax for wide rows, split over blocks that stage their chunk in shared memory (an experiment).

gpu_jobs/softmax_staged.cu says why: the shipped split kernel holds its chunk in registers, so few blocks fit
an SM and the wait for a row's other chunks leaves its loads idle; staged in shared memory the chunk leaves
the registers free and more blocks keep loading. Measured against the shipped online_softmax and a same-size
copy, each configuration checked against the fp64 reference with the output poisoned first (softmax_lagged's
Case and Recorder). Built with nvcc alone and loaded with ctypes, as softmax_cluster.py.

    python gpu_jobs/softmax_staged.py OUTDIR [--budget-s 120]   # GPU: table on stdout, OUTDIR/results.csv
    python gpu_jobs/softmax_staged.py --build-only OUTDIR       # no GPU: nvcc and ptxas's register counts
"""

import argparse
import ctypes
import os
import subprocess
import sys
import time

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [(1024, 262144), (4096, 32768)]
CHUNK_ELEMENTS = (4096, 8192, 16384, 32768)
THREADS = (128, 256, 512)
MAX_SPIN = 1 << 16


def build(out_dir: str) -> str:
    lib = os.path.join(out_dir, "libsoftmax_staged.so")
    cmd = ["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    cmd += ["-I", os.path.join(HERE, "..", "labkernels", "csrc", "cuda"), "-o", lib]
    cmd += [os.path.join(HERE, "softmax_staged.cu")]
    start = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(f"nvcc: rc={done.returncode} in {time.time() - start:.1f} s", flush=True)
    notes = [line for line in done.stderr.splitlines() if "Used" in line or "error" in line]
    print("\n".join(notes), flush=True)
    if done.returncode:
        print(done.stderr[-3000:])
        sys.exit(1)
    return lib


def launcher(lib, case, chunk_vecs: int, threads: int):
    x, out = case.x, case.out
    vec = 16 // x.element_size()
    chunks = -(-(x.shape[1] // vec) // chunk_vecs)
    stats = torch.empty(x.shape[0] * chunks * 2, device="cuda", dtype=torch.float32)
    sync = torch.empty(1 + x.shape[0], device="cuda", dtype=torch.int32)  # zeroed by each launch
    args = (ctypes.c_int(0 if x.dtype == torch.float32 else 3), ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(stats.data_ptr()),
            ctypes.c_void_p(sync.data_ptr()),
            ctypes.c_longlong(x.shape[0]), ctypes.c_longlong(x.shape[1] // vec),
            ctypes.c_longlong(x.stride(0) // vec), ctypes.c_longlong(out.stride(0) // vec),
            ctypes.c_int(chunk_vecs), ctypes.c_int(threads), ctypes.c_int(MAX_SPIN))  # fmt: skip

    def call():
        err = lib.lk_softmax_staged(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"cudaError {err}")

    return call


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--budget-s", type=float, default=120)
    parser.add_argument("--build-only", action="store_true")
    a = parser.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    path = build(a.out_dir)
    if a.build_only:
        return 0
    lib = ctypes.CDLL(path)
    from labkernels.ch06_attention import online_softmax as osm

    rec = lagged.Recorder(os.path.join(a.out_dir, "results.csv"))
    start = time.time()
    for rows, cols in CASES:
        for dtype in ("bfloat16", "float32"):
            if time.time() - start > a.budget_s:
                print("budget spent", flush=True)
                break
            case = lagged.Case(rows, cols, dtype)
            case.copy_ms = lagged.bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
            shipped = str(osm.config(rows, cols, getattr(torch, dtype)))
            rec.measure(case, "shipped", shipped, lambda c=case: osm.online_softmax(c.x, c.out))
            vec = 16 // case.x.element_size()
            for elements in CHUNK_ELEMENTS:
                chunk_vecs = elements // vec
                if cols // elements > 64:
                    continue  # the shipped kernel's limit on chunks a row, too
                for threads in THREADS:
                    fits = lib.lk_staged_resident(0 if dtype == "float32" else 3, chunk_vecs, threads)
                    cfg = f"chunk={elements} threads={threads} resident/SM={fits}"
                    rec.measure(case, "staged", cfg, launcher(lib, case, chunk_vecs, threads))
    best = {}
    for r in rec.rows:
        key = (r["rows"], r["cols"], r["dtype"], r["variant"])
        if r["correct"] and r["fraction_of_same_size_copy"] > best.get(key, (0, ""))[0]:
            best[key] = (r["fraction_of_same_size_copy"], r["config"])
    print("\nbest fraction of a same-size copy:")
    for k, (f, cfg) in sorted(best.items()):
        print(f"  {k}: {f:.3f}  {cfg}")
    wrong = [r for r in rec.rows if not r["correct"]]
    print(f"{len(rec.rows)} measured, {len(wrong)} wrong", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
