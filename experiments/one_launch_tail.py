"""The tiles past the last full wave as narrower tiles, in the same launch as the full waves (an experiment).

`wave_tail.py` ran the 24 tiles left over at 1536^3 as a second launch, on a second stream, with tiles a
quarter as wide: 0.76 of cuBLAS in CUDA-graph replays, but a plain call paid 107 us of host time for two
launches and the streams' hand-offs. The package's `wave_tail._waves_and_tail` does the same in one launch:
its first programs run the full waves' tiles, the last ones the rectangle in narrow tiles (one kernel, the
shared memory of the bigger tile, registers of the larger branch).

Here, at 1536^3 bf16, each narrow width of the one-launch kernel, the two-stream form (`wave_tail.Runner`)
and chapter 03's kernel on all tiles are checked against fp64 on a poisoned C and bitwise against a second
call, then timed beside cuBLAS in alternating rounds, both as CUDA-graph replays and as plain calls (host
included), and the host time of a call alone (`host_us`).

    PYTHONPATH=$PWD:$PWD/experiments python experiments/one_launch_tail.py   # GPU; $OUT/one_launch_tail/*.csv
    PYTHONPATH=$PWD:$PWD/experiments python experiments/one_launch_tail.py --cpu-smoke  # interpreter, fp32
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import triton

from labkernels.ch04_libraries import splitk, wave_tail
from labkernels.lane import sm_count
from labkernels.timing import graph_ms, host_us, time_ms
from wave_tail import PICK, Runner, Tile, launch_tiles, operands

NARROW = (16, 32, 64)


def pick_meta(a, b, c, t: Tile) -> dict:
    """Chapter 03's constexprs for tile t, as the package passes them."""
    config = triton.Config(
        {"BLOCK_SIZE_M": t.m, "BLOCK_SIZE_N": t.n, "BLOCK_SIZE_K": t.k, "GROUP_SIZE_M": 8},
        num_stages=t.stages,
        num_warps=t.warps,
    )
    return wave_tail._meta(a, b, c, config, "ieee")


def one_launch(t: Tile, narrow: int, sms: int):
    """run(a, b, c) -> c: the one-launch kernel with tile t and narrow tiles `narrow` wide. The first call
    launches and keeps the launcher, as the package does (same operands' shapes and strides afterwards)."""
    kept = []

    def run(a, b, c):
        if kept:
            kept[0](a, b, c)  # read MK + KN, write MN
        else:
            kept.append(wave_tail.launch(a, b, c, pick_meta(a, b, c, t), sms, narrow)[1])
        return c

    return run


def cpu_smoke() -> int:
    torch.manual_seed(0)
    failures = 0
    big = Tile(32, 32, 32, 1, 4)
    for m, n, k, sms in ((97, 61, 45, 3), (160, 96, 64, 5), (150, 170, 45, 7)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for narrow in (8, 16):
            err, same = recording.checked_matmul(one_launch(big, narrow, sms), a, b, splitk.reference)
            ok = err < 1e-5 and same
            failures += not ok
            rect = wave_tail.leftover(m, n, big.m, big.n, sms, 8)
            print(f"{m}x{n}x{k} narrow {narrow:3d} {rect} err {err:.1e} {'ok' if ok else 'WRONG'}")
    return int(failures > 0)


def gpu_main(out_dir: str, args) -> int:
    meta = recording.versioned()
    sms = sm_count()
    m = n = k = 1536
    a, b, c, ref = operands(m)
    print("leftover:", wave_tail.leftover(m, n, PICK.m, PICK.n, sms, 8), flush=True)
    runs = {f"one launch, 64x{w} narrow": one_launch(PICK, w, sms) for w in NARROW}
    runs["two streams, 64x32 narrow"] = Runner(PICK, Tile(64, 32, 64, 3, 4), sms, a.device)
    runs["ch03 kernel, all 288"] = lambda a, b, c: launch_tiles(a, b, c, PICK)
    checks, failures, calls = {}, 0, {"cublas": lambda: a @ b}
    for name, run in runs.items():
        checks[name] = recording.checked_matmul(run, a, b, splitk.reference)
        calls[name] = lambda run=run: run(a, b, c)
    calls["package wave_tail"] = lambda: splitk.matmul(a, b, kernel="wave_tail")
    calls["package tiled"] = lambda: splitk.matmul(a, b, kernel="tiled")
    checks["package wave_tail"] = (recording.rel_err(splitk.matmul(a, b, kernel="wave_tail"), ref), True)
    checks["package tiled"] = (recording.rel_err(splitk.matmul(a, b, kernel="tiled"), ref), True)
    timers = {"graph": lambda call: graph_ms(call, rep=30), "plain": lambda call: time_ms(call, rep=30)}
    rows = []
    for mode, timer in timers.items():
        timed = recording.alternating_medians(calls, args.rounds, timer)
        cublas = timed["cublas"][0]
        for name, (med, spread) in timed.items():
            err, same = checks.get(name, (0.0, True))
            ok = err < 2e-2 and same
            failures += not ok
            host = host_us(calls[name], calls=300) if mode == "plain" else None
            rows.append(meta | {"m": m, "n": n, "k": k, "impl": name, "mode": mode, "ms": med,
                                "spread": spread, "of_cublas": cublas / med, "host_us": host, "rel_err": err,
                                "bitwise_repeatable": same})  # fmt: skip
            host_text = f" host {host:6.1f} us" if host is not None else ""
            print(f"{mode:5s} {name:28s} {med * 1e3:7.2f} us {cublas / med:.3f} of cuBLAS spread {spread:.2f}"
                  f"{host_text} err {err:.1e} {'' if ok else 'WRONG'}", flush=True)  # fmt: skip
    recording.write_csv(f"{out_dir}/one_launch_tail.csv", rows)
    return int(failures > 0)


if __name__ == "__main__":
    recording.main(__doc__, cpu_smoke, gpu_main, "one_launch_tail")
