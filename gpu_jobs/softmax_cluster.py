"""Online softmax for wide rows with Hopper thread-block clusters (gpu_jobs/softmax_cluster.cu).

One cluster of C blocks a row; each block holds its chunk in registers, the blocks exchange (max, sum)
through distributed shared memory after a cluster barrier, and write exp(x - M) / L: read MN, write MN.
Measured against the shipped online_softmax (Triton; its split mode exchanges through global memory with
atomics and polling) and a same-size copy, every configuration checked against the fp64 reference with
the output poisoned first. The kernel is built here with nvcc alone (gpu_jobs/softmax_cluster.cu,
ctypes), not through the torch extension, so a run takes seconds to start.

    python gpu_jobs/softmax_cluster.py OUTDIR [--budget-s 170]   # GPU: table on stdout, OUTDIR/results.csv
"""

import argparse
import ctypes
import itertools
import os
import subprocess
import sys
import time

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

import torch
import triton

DTYPE_TAG = {"float32": 0, "float16": 2, "bfloat16": 3}  # launch.h's Dtype
CASES = [(8192, 5000), (4096, 32768), (1024, 262144), (37, 100008)]
HERE = os.path.dirname(os.path.abspath(__file__))


def build(out_dir: str, plain: bool) -> ctypes.CDLL:
    lib = os.path.join(out_dir, f"libsoftmax_cluster{'_plain' * plain}.so")
    cmd = ["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    cmd += ["-DLK_SOFTMAX_PLAIN_ACCESS"] * plain  # plain loads and stores instead of the streaming hints
    cmd += ["-I", os.path.join(HERE, "..", "labkernels", "csrc", "cuda"), "-o", lib]
    cmd += [os.path.join(HERE, "softmax_cluster.cu")]
    start = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(f"nvcc: rc={done.returncode} in {time.time() - start:.1f} s", flush=True)
    with open(os.path.join(out_dir, f"ptxas{'_plain' * plain}.txt"), "w") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode:
        print(done.stderr[-3000:])
        sys.exit(1)
    return ctypes.CDLL(lib)


def configs(row_vecs: int):
    """(cluster, threads, vecs_per_thread) that cover a row: threads a multiple of 32 from 64 to 1024."""
    out = []
    for cluster in (1, 2, 4, 8, 16):
        chunk = triton.cdiv(row_vecs, cluster)
        for vecs in (1, 2, 4, 8):
            threads = max(64, 32 * triton.cdiv(triton.cdiv(chunk, vecs), 32))
            if threads <= (512 if vecs == 8 else 1024):
                out.append((cluster, threads, vecs))
    return out


def launcher(lib, case, cluster, threads, vecs, persistent, x=None):
    x = case.x if x is None else x
    vec = 16 // x.element_size()
    tag = DTYPE_TAG[case.dtype]
    args = (ctypes.c_int(tag), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(case.out.data_ptr()),
            ctypes.c_longlong(x.shape[0]), ctypes.c_longlong(x.shape[1] // vec),
            ctypes.c_longlong(x.stride(0) // vec), ctypes.c_longlong(case.out.stride(0) // vec),
            ctypes.c_int(cluster), ctypes.c_int(threads), ctypes.c_int(vecs), ctypes.c_int(persistent))  # fmt: skip

    def call():
        err = lib.lk_softmax_cluster(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"cudaError {err}")

    return call


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--budget-s", type=float, default=150)
    a = parser.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    libs = {"": build(a.out_dir, False), "plain_": build(a.out_dir, True)}
    from labkernels.ch06_attention import online_softmax as osm

    rec = lagged.Recorder(os.path.join(a.out_dir, "results.csv"))
    start = time.time()
    for rows, cols in CASES:
        for dtype in ("bfloat16", "float32", "float16"):
            if dtype == "float16" and cols != 262144:
                continue
            if time.time() - start > a.budget_s:
                print("budget spent", flush=True)
                break
            case = lagged.Case(rows, cols, dtype)
            case.copy_ms = lagged.bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
            shipped = str(osm.config(rows, cols, getattr(torch, dtype)))
            rec.measure(case, "shipped", shipped, lambda c=case: osm.online_softmax(c.x, c.out))
            vec = 16 // case.x.element_size()
            for cluster, threads, vecs in configs(cols // vec):
                fits = libs[""].lk_active_clusters(DTYPE_TAG[dtype], cluster, threads, vecs)
                for (access, lib), persistent in itertools.product(libs.items(), (0, 1)):
                    cfg = f"cluster={cluster} threads={threads} vecs={vecs} resident={fits}"
                    variant = access + ("cluster_persistent" if persistent else "cluster")
                    rec.measure(case, variant, cfg, launcher(lib, case, cluster, threads, vecs, persistent))
            if rows == 37:  # strided rows: a view of every other row of a wider buffer
                wide = torch.randn(rows, cols + 64, device="cuda").to(getattr(torch, dtype))
                case.x = wide[:, :cols]
                case.ref = osm.reference(case.x.double())
                cluster, threads, vecs = configs(cols // vec)[-1]
                for persistent in (0, 1):
                    rec.measure(case, "strided" + "_persistent" * persistent,
                                f"cluster={cluster} threads={threads} vecs={vecs}",
                                launcher(libs[""], case, cluster, threads, vecs, persistent))
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
