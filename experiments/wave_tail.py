"""The tiles past the last full wave as smaller tiles, in a second launch beside the first (an experiment).

At 1536^3 chapter 03's pick, 64 x 128 tiles, makes 288 programs for 132 SMs. `tile_count.py` measured its
kernel on the first 264 tiles (two an SM) at 13.9 us and on all 288 at 16.5 us: the 24 SMs that run a third
tile are the ones everybody waits for. Here the first 264 tiles run as before, and the 24 left over (a
rectangle of C in the grouped order) run as a separate launch of the same kernel on views of A, B and C,
with a smaller tile, on a second stream: its programs take the shared memory the big tiles leave free, on
every SM, and spread the leftover work over all of them. No partial sums, no tickets, no new kernel.

Each variant is checked against fp64 on a poisoned C, bitwise against a second call, and again after the
timed graph replays; timed as CUDA-graph replays in alternating rounds beside cuBLAS, chapter 04's shipped
`matmul` and chapter 03's kernel on the whole grid.

    PYTHONPATH=$PWD python experiments/wave_tail.py            # GPU; CSV to $OUT/wave_tail/wave_tail.csv
    PYTHONPATH=$PWD python experiments/wave_tail.py --cpu-smoke  # interpreter: correctness, small fp32 shapes
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import contextlib
from typing import NamedTuple

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import triton

from labkernels.ch03_triton import matmul as ch03
from labkernels.ch04_libraries import splitk, wave_tail
from labkernels.lane import sm_count
from labkernels.timing import graph_ms


class Tile(NamedTuple):
    m: int
    n: int
    k: int
    stages: int
    warps: int

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k} s{self.stages} w{self.warps}"


def leftover_rectangle(m: int, n: int, t: Tile, group: int, sms: int) -> tuple[int, tuple | None]:
    """(whole tiles, the rectangle of C the rest covers or None): the package's rule for this tile."""
    return wave_tail.leftover(m, n, t.m, t.n, sms, group)


def launch_tiles(a, b, c, t: Tile, programs: int | None = None, group: int = 8):
    """Chapter 03's tiled kernel on a, b, c (views allowed): the first `programs` tiles (all when None).
    Returns c."""
    (M, K), N = a.shape, b.shape[1]
    strides = (*a.stride(), *b.stride(), *c.stride())
    tiles = triton.cdiv(M, t.m) * triton.cdiv(N, t.n)
    ch03._matmul_tiles[(tiles if programs is None else programs,)](
        a, b, c, c, M, N, K, *strides, HAS_BIAS=False, ACTIVATION=None, INPUT_PRECISION="ieee",
        BLOCK_SIZE_M=t.m, BLOCK_SIZE_N=t.n, BLOCK_SIZE_K=t.k, GROUP_SIZE_M=group, EVEN_K=K % t.k == 0,
        INDEX_64=False, ALIGN=ch03.row_alignment(N, strides), num_stages=t.stages, num_warps=t.warps,
    )  # fmt: skip
    return c


class Runner:
    """The full waves of `big` tiles on the current stream, the rest with `small` tiles on a second one."""

    def __init__(self, big: Tile, small: Tile, sms: int, device, small_first: bool = False, one_stream=False):
        self.big, self.small, self.sms, self.small_first = big, small, sms, small_first
        on_gpu = device.type == "cuda" and not one_stream
        self.side = torch.cuda.Stream(device) if on_gpu else None

    @property
    def name(self) -> str:
        order = " small first" if self.small_first else ""
        return f"{self.big.name} + {self.small.name}{order}{'' if self.side else ' one stream'}"

    def __call__(self, a, b, c):
        M, N = a.shape[0], b.shape[1]
        whole, rect = leftover_rectangle(M, N, self.big, 8, self.sms)
        if rect is None:
            return launch_tiles(a, b, c, self.big)
        r0, r1, c0, c1 = rect
        main = torch.cuda.current_stream() if self.side is not None else None
        if self.side is not None:
            self.side.wait_stream(main)

        def rest():
            with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
                launch_tiles(a[r0:r1], b[:, c0:c1], c[r0:r1, c0:c1], self.small)

        if self.small_first:
            rest()
        launch_tiles(a, b, c, self.big, programs=whole)
        if not self.small_first:
            rest()
        if self.side is not None:
            main.wait_stream(self.side)
        return c


PICK = Tile(64, 128, 64, 3, 4)  # chapter 03's pick at 1536^3 (ch04_wide_tiles.csv, three fresh processes)
SMALL = [
    Tile(64, 128, 64, 3, 4), Tile(64, 64, 64, 3, 4), Tile(64, 64, 128, 2, 4), Tile(64, 32, 64, 3, 4),
    Tile(64, 32, 128, 3, 4), Tile(32, 64, 64, 3, 4), Tile(32, 32, 64, 3, 4), Tile(32, 32, 128, 2, 4),
    Tile(16, 64, 128, 2, 4),
]  # fmt: skip


def cpu_smoke() -> int:
    torch.manual_seed(0)
    failures = 0
    for m, n, k, sms in ((97, 61, 45, 3), (160, 96, 64, 5), (256, 256, 64, 5)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for big, small in ((Tile(32, 32, 32, 1, 4), Tile(16, 16, 32, 1, 4)), (Tile(32, 32, 16, 1, 4),) * 2):
            run = Runner(big, small, sms, a.device)
            err, same = recording.checked_matmul(run, a, b, splitk.reference)
            ok = err < 1e-5 and same
            failures += not ok
            print(f"{m}x{n}x{k} {run.name:40s} {leftover_rectangle(m, n, big, 8, sms)} err {err:.1e} "
                  f"{'ok' if ok else 'WRONG'}")  # fmt: skip
    return int(failures > 0)


def operands(size: int = 1536):
    """(a, b, c, reference): seeded bf16 operands of size^3 on the GPU, an empty C, the fp64 product."""
    torch.manual_seed(0)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    return a, b, torch.empty(size, size, device="cuda", dtype=torch.bfloat16), splitk.reference(a, b)


def gpu_main(out_dir: str, args) -> int:
    meta = recording.versioned()
    sms = sm_count()
    m = n = k = 1536
    a, b, c, ref = operands(m)
    print("leftover:", leftover_rectangle(m, n, PICK, 8, sms), flush=True)
    runners = [Runner(PICK, s, sms, a.device) for s in SMALL]
    runners += [Runner(PICK, s, sms, a.device, small_first=True) for s in SMALL[1:4]]
    runners += [Runner(PICK, s, sms, a.device, one_stream=True) for s in SMALL[1:2]]
    calls = {"cublas": lambda: a @ b, "shipped": lambda: splitk.matmul(a, b),
             "ch03 kernel, all 288": lambda: launch_tiles(a, b, c, PICK)}  # fmt: skip
    checks, failures = {"shipped": (recording.rel_err(splitk.matmul(a, b), ref), True)}, 0
    whole = lambda a, b, c: launch_tiles(a, b, c, PICK)  # noqa: E731
    checks["ch03 kernel, all 288"] = recording.checked_matmul(whole, a, b, splitk.reference)
    for run in runners:
        try:
            checks[run.name] = recording.checked_matmul(run, a, b, splitk.reference)
        except Exception as e:  # out of resources, a compile error: the other variants still run
            print(f"{run.name}: FAILED {e!r:.300}", flush=True)
            failures += 1
            continue
        calls[run.name] = lambda r=run: r(a, b, c)
    timed = recording.alternating_medians(calls, args.rounds, lambda call: graph_ms(call, rep=30))
    cublas = timed["cublas"][0]
    rows = []
    for name, (med, spread) in timed.items():
        err, same = checks.get(name, (0.0, True))
        c.fill_(float("nan"))
        after = recording.rel_err(calls[name](), ref)  # C poisoned: a call that skips a tile shows
        ok = err < 2e-2 and same and after < 2e-2
        failures += not ok
        rows.append(meta | {"m": m, "n": n, "k": k, "impl": name, "ms": med, "spread": spread,
                            "of_cublas": cublas / med, "rel_err": err, "bitwise_repeatable": same,
                            "rel_err_after_replays": after})  # fmt: skip
        print(f"{name:48s} {med * 1e3:7.2f} us {cublas / med:.3f} of cuBLAS spread {spread:.2f} "
              f"err {err:.1e}/{after:.1e} {'' if ok else 'WRONG'}", flush=True)  # fmt: skip
    recording.write_csv(f"{out_dir}/wave_tail.csv", rows)
    return int(failures > 0)


if __name__ == "__main__":
    recording.main(__doc__, cpu_smoke, gpu_main, "wave_tail")
