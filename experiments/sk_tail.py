"""Whole tiles for the full waves, stream-K for the rest, no waiting (an experiment; GPU, CPU smoke mode).

At 1536^3 on 132 SMs, 64 x 128 tiles make 288 programs: 2 an SM and 24 left over, so 24 SMs run a third tile
while 108 idle for a third of the time. This kernel launches the full waves' tiles whole (data-parallel, DP)
and cuts only the leftover tiles' K-steps into one equal range per SM (stream-K, SK):
- program q < SK_PROGRAMS takes K-steps [q T / P, (q + 1) T / P) of the T = SK_TILES x steps leftover
  steps (P = SK_PROGRAMS >= SK_TILES / 2: a range touches at most 3 tiles, SLOTS); a range that covers a tile
  only in part stores its fp32 partial in its own slot and takes a ticket (an atomic counter per tile);
  the program whose ticket is the tile's last adds every piece's slot in program order (bitwise
  reproducible) and stores C, and resets the ticket to 0 for the next launch (CUDA-graph replays need no
  reset). Nobody spins: the last to arrive does the sum, so no program needs another to be resident;
- the other programs take one whole tile each (SK programs first: their short ranges start, and finish,
  first; an SM holding 3 programs of this tile then runs 2 whole tiles and a short range).

Checked against fp64 (poisoned output), twice for bitwise equality, and after the timed graph replays
(tickets left at 0); timed as CUDA-graph replays in alternating rounds beside cuBLAS and the shipped matmul.

    PYTHONPATH=$PWD python experiments/sk_tail.py            # GPU; CSV to $OUT/sk_tail/sk_tail.csv
    PYTHONPATH=$PWD python experiments/sk_tail.py --cpu-smoke  # interpreter: correctness, small fp32 shapes
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import contextlib
from typing import NamedTuple

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import triton
import triton.language as tl

from labkernels.ch03_triton import matmul as ch03
from labkernels.ch03_triton.matmul import _tile_coordinates
from labkernels.ch04_libraries import splitk
from labkernels.ch04_libraries.splitk import _dot_range, _store_tile
from labkernels.lane import sm_count
from labkernels.timing import graph_ms


@triton.jit
def _first_program(step, TOTAL, PROGRAMS):
    """The SK program whose range [q T / P, (q + 1) T / P) holds K-step `step` of the T leftover steps."""
    return ((step + 1) * PROGRAMS - 1) // TOTAL


@triton.jit
def _sk_tail_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, tickets_ptr, M, N, K, SK_TILES, SK_PROGRAMS, SK_FIRST_TILE,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr, BIG: tl.constexpr, ALIGN: tl.constexpr,
    SLOTS: tl.constexpr = 3,  # partial tiles a program may leave: its range spans at most 3 tiles
    SK_LAST: tl.constexpr = False,  # the stream-K programs are the grid's last, not its first
    SK_ONLY: tl.constexpr = False,  # the grid is the stream-K programs alone (another kernel runs the rest)
    ATOMIC_FIXUP: tl.constexpr = False,  # pieces add into one fp32 sum a tile (not in a fixed order)
):  # fmt: skip
    pid = tl.program_id(axis=0)
    if SK_LAST:  # renumber: stream-K programs 0 .. SK_PROGRAMS - 1 whatever their place in the grid
        pid = (pid + SK_PROGRAMS) % tl.num_programs(axis=0)
    steps = tl.cdiv(K, BLOCK_SIZE_K)
    if not SK_ONLY and pid >= SK_PROGRAMS:  # data-parallel: tile SK_TILES + (pid - SK_PROGRAMS), all of K
        pid_m, pid_n = _tile_coordinates(
            SK_TILES + pid - SK_PROGRAMS, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M
        )
        acc = _dot_range(
            a_ptr, b_ptr, pid_m, pid_n, 0, steps, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
            INPUT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K, BIG, ALIGN,
        )  # fmt: skip
        _store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BIG)
    else:  # stream-K: K-steps [start, end) of the leftover tiles 0 .. SK_TILES - 1
        total = SK_TILES * steps
        start = pid * total // SK_PROGRAMS
        end = (pid + 1) * total // SK_PROGRAMS
        first_tile = start // steps
        tile_size: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
        slot = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
        for tile in range(first_tile, (end - 1) // steps + 1):  # one to three tiles
            tile_begin = tile * steps
            lo = tl.maximum(start, tile_begin)
            hi = tl.minimum(end, tile_begin + steps)
            pid_m, pid_n = _tile_coordinates(
                SK_FIRST_TILE + tile, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M
            )
            acc = _dot_range(
                a_ptr, b_ptr, pid_m, pid_n, lo - tile_begin, hi - tile_begin, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn,
                INPUT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K, BIG, ALIGN,
            )  # fmt: skip
            q_first = _first_program(tile_begin, total, SK_PROGRAMS)
            q_last = _first_program(tile_begin + steps - 1, total, SK_PROGRAMS)
            if q_first == q_last:  # the whole tile is this program's
                _store_tile(
                    c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BIG
                )
            elif ATOMIC_FIXUP:  # every piece adds into the tile's fp32 sum; the last converts and stores
                sums = ws_ptr + tile * tile_size + slot  # < 2^31: at most 4 x SMs tiles
                tl.atomic_add(sums, acc, sem="relaxed")  # read-add-write BM x BN fp32, in L2
                tl.debug_barrier()  # every thread's adds are issued before the ticket says so
                ticket = tl.atomic_add(tickets_ptr + tile, 1, sem="acq_rel")
                if ticket == q_last - q_first:
                    total_acc = tl.load(sums, cache_modifier=".cg")  # read BM x BN fp32
                    _store_tile(
                        c_ptr, total_acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                        BLOCK_SIZE_M, BLOCK_SIZE_N, BIG,
                    )  # fmt: skip
                    tl.store(sums, tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32))  # for next time
                    tl.debug_barrier()
                    tl.atomic_xchg(tickets_ptr + tile, 0)
            else:
                mine = (pid * SLOTS + tile - first_tile).to(tl.int64) * tile_size
                tl.store(ws_ptr + mine + slot, acc)  # write BM x BN fp32 (stays in L2)
                tl.debug_barrier()  # every thread's part is written before the ticket says so
                ticket = tl.atomic_add(tickets_ptr + tile, 1, sem="acq_rel")
                if ticket == q_last - q_first:  # the last piece in: add all, in program order
                    total_acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                    for q in range(q_first, q_last + 1):
                        q_tile0 = (q * total // SK_PROGRAMS) // steps
                        theirs = (q * SLOTS + tile - q_tile0).to(tl.int64) * tile_size
                        # read BM x BN fp32 (.cg: from L2, where the other SMs' stores are)
                        total_acc += tl.load(ws_ptr + theirs + slot, cache_modifier=".cg")
                    _store_tile(
                        c_ptr, total_acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                        BLOCK_SIZE_M, BLOCK_SIZE_N, BIG,
                    )  # fmt: skip
                    tl.atomic_xchg(tickets_ptr + tile, 0)  # ready for the next launch


class Variant(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    sk_waves: int = 0  # leftover tiles plus this many full waves go to stream-K (-1: none, all whole tiles)
    sk_last: bool = False
    two_kernels: bool = False  # whole tiles by chapter 03's tiled kernel, stream-K beside it on a 2nd stream
    atomic: bool = False  # ATOMIC_FIXUP: fp32 atomics into one sum a tile (not bitwise repeatable)
    sk_alone: bool = False  # two kernels, the stream-K one alone (timing only: C is not all written)
    per_sm: int = 1  # stream-K programs per SM
    maxnreg: int | None = None  # cap on registers a thread (ptxas spills past it): 168 lets 3 programs fit

    @property
    def name(self) -> str:
        extra = {0: "", -1: " no SK"}.get(self.sk_waves, f" +{self.sk_waves} wave")
        extra += " SK last" if self.sk_last else ""
        extra += " 2 kernels" if self.two_kernels else ""
        extra += " atomic" if self.atomic else ""
        extra += " SK alone" if self.sk_alone else ""
        extra += f" {self.per_sm}/SM" if self.per_sm > 1 else ""
        extra += f" maxnreg {self.maxnreg}" if self.maxnreg else ""
        return f"{self.block_m}x{self.block_n}x{self.block_k} s{self.stages} w{self.warps}{extra}"

    def split(self, m: int, n: int, sms: int) -> tuple[int, int, int]:
        """(tiles, SK tiles, SK programs): the tiles past the last full wave, plus sk_waves waves, go SK."""
        tiles = triton.cdiv(m, self.block_m) * triton.cdiv(n, self.block_n)
        sk_tiles = 0 if self.sk_waves < 0 else min(tiles, tiles % sms + self.sk_waves * sms)
        return tiles, sk_tiles, (sms * self.per_sm if sk_tiles else 0)


class Runner:
    """Launches one variant; the slots and tickets are kept (tickets start at 0; each launch leaves 0)."""

    def __init__(self, v: Variant, sms: int, device):
        self.v, self.sms = v, sms
        self.side = torch.cuda.Stream(device) if v.two_kernels and device.type == "cuda" else None
        slots = 4 * sms * v.per_sm  # SLOTS (3) a program, and tickets for as many tiles
        self.ws = torch.zeros(slots * v.block_m * v.block_n, device=device, dtype=torch.float32)
        self.tickets = torch.zeros(slots + 1, device=device, dtype=torch.int32)

    def __call__(self, a, b, c):
        (M, K), N = a.shape, b.shape[1]
        tiles, sk_tiles, programs = self.v.split(M, N, self.sms)
        programs = min(programs, sk_tiles * triton.cdiv(K, self.v.block_k))  # no program with an empty range
        assert sk_tiles <= self.tickets.numel() and 2 * programs >= sk_tiles
        strides = (*a.stride(), *b.stride(), *c.stride())
        if self.v.two_kernels:
            return self._two_kernels(a, b, c, tiles, sk_tiles, programs, strides)
        self.compiled = _sk_tail_kernel[(tiles - sk_tiles + programs,)](
            a, b, c, self.ws, self.tickets, M, N, K, sk_tiles, programs, 0, *strides,
            INPUT_PRECISION="ieee", BLOCK_SIZE_M=self.v.block_m, BLOCK_SIZE_N=self.v.block_n,
            BLOCK_SIZE_K=self.v.block_k, GROUP_SIZE_M=8, EVEN_K=K % self.v.block_k == 0, BIG=False,
            ALIGN=ch03.row_alignment(N, strides), SK_LAST=self.v.sk_last, ATOMIC_FIXUP=self.v.atomic,
            num_stages=self.v.stages, num_warps=self.v.warps, **self._cap(),
        )  # fmt: skip
        return c

    def _cap(self) -> dict:
        return {} if self.v.maxnreg is None else {"maxnreg": self.v.maxnreg}

    def _meta(self, K: int, strides: tuple, N: int) -> dict:
        v = self.v
        return dict(BLOCK_SIZE_M=v.block_m, BLOCK_SIZE_N=v.block_n, BLOCK_SIZE_K=v.block_k, GROUP_SIZE_M=8,
                    EVEN_K=K % v.block_k == 0, ALIGN=ch03.row_alignment(N, strides),
                    num_stages=v.stages, num_warps=v.warps)  # fmt: skip

    def _two_kernels(self, a, b, c, tiles, sk_tiles, programs, strides):
        """Tiles 0 .. tiles - sk_tiles - 1 whole, by chapter 03's tiled kernel (a grid of that many programs
        computes exactly those, in its grouped order); the last sk_tiles by the stream-K programs alone, on a
        second stream, so both kernels' programs share the SMs."""
        (M, K), N = a.shape, b.shape[1]
        meta = self._meta(K, strides, N)
        main = torch.cuda.current_stream() if self.side is not None else None
        if sk_tiles:
            if self.side is not None:
                self.side.wait_stream(main)
            with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
                _sk_tail_kernel[(programs,)](
                    a, b, c, self.ws, self.tickets, M, N, K, sk_tiles, programs, tiles - sk_tiles, *strides,
                    INPUT_PRECISION="ieee", BIG=False, SK_ONLY=True, ATOMIC_FIXUP=self.v.atomic, **meta,
                )  # fmt: skip
        if not self.v.sk_alone:
            ch03._matmul_tiles[(tiles - sk_tiles,)](
                a, b, c, c, M, N, K, *strides, HAS_BIAS=False, ACTIVATION=None, INPUT_PRECISION="ieee",
                INDEX_64=False, **meta,
            )  # fmt: skip
        if sk_tiles and self.side is not None:
            main.wait_stream(self.side)
        return c


GPU_SHAPES = {
    (1536, 1536, 1536): [
        Variant(64, 128, 64, 3, 4, two_kernels=True, atomic=True),
        Variant(64, 128, 64, 3, 4, atomic=True),
        Variant(128, 128, 64, 3, 8, two_kernels=True, atomic=True),
        Variant(128, 128, 64, 4, 8, two_kernels=True, atomic=True),
        Variant(64, 128, 64, 3, 4, two_kernels=True, sk_alone=True),
        Variant(64, 128, 64, 3, 4, two_kernels=True, atomic=True, sk_alone=True),
        Variant(64, 128, 64, 3, 4, two_kernels=True),  # chapter 03's pick for 264 tiles, SK for 24
        Variant(64, 128, 64, 3, 4, sk_waves=-1, two_kernels=True),  # chapter 03's kernel alone, 288 tiles
        Variant(128, 64, 64, 3, 4, two_kernels=True),
        Variant(128, 128, 64, 3, 8, two_kernels=True),
        Variant(128, 128, 64, 4, 8, two_kernels=True),
        Variant(64, 128, 64, 3, 4, sk_waves=-1),  # 288 whole tiles, as chapter 03's tiled kernel
        Variant(64, 128, 64, 3, 4, sk_last=True),
        Variant(128, 128, 64, 4, 8, sk_waves=-1),
        Variant(128, 128, 64, 4, 8, sk_last=True),
        Variant(64, 128, 64, 3, 4),  # 288 tiles: 264 whole, 24 SK; 3 programs an SM
        Variant(64, 128, 64, 4, 4),
        Variant(128, 64, 64, 3, 4),
        Variant(128, 128, 64, 3, 8),  # 144 tiles: 132 whole, 12 SK; 2 an SM
        Variant(128, 128, 64, 4, 8),  # 1 an SM
        Variant(64, 128, 64, 3, 4, sk_waves=1),
        Variant(128, 128, 64, 3, 8, sk_waves=1),
    ],
    (3000, 5000, 1000): [
        Variant(128, 256, 64, 3, 8, two_kernels=True),
        Variant(128, 256, 64, 3, 8),  # 480 tiles: 396 whole, 84 SK
        Variant(128, 128, 64, 4, 8),  # 960 tiles: 924 whole, 36 SK
        Variant(128, 128, 64, 3, 8),
    ],
    (1024, 1024, 1024): [
        Variant(64, 128, 64, 3, 4),  # 128 tiles: all SK (fewer tiles than SMs)
        Variant(128, 128, 64, 3, 8),  # 64 tiles
    ],
    (4096, 4096, 4096): [
        Variant(128, 256, 64, 3, 8, two_kernels=True),
        Variant(128, 256, 64, 3, 8),  # 512 tiles: 396 whole, 116 SK
        Variant(128, 128, 64, 4, 8),
    ],
}
# Three programs an SM: chapter 03's kernel (128 registers) fits three, this one (225 under triton 3.6) two
# unless its registers are capped; then classic stream-K over 3 x SMs programs, or whole tiles plus a tail.
OCCUPANCY_SHAPES = {
    (1536, 1536, 1536): [
        Variant(64, 128, 64, 3, 4, sk_waves=-1, maxnreg=168),  # 288 whole tiles, 3 an SM
        Variant(64, 128, 64, 3, 4, maxnreg=168),  # 264 whole, 24 SK over 132 programs
        Variant(64, 128, 64, 3, 4, atomic=True, maxnreg=168),
        Variant(64, 128, 64, 3, 4, sk_waves=2, per_sm=3, maxnreg=168),  # all 288 SK over 396 programs
        Variant(64, 128, 64, 3, 4, sk_waves=2, per_sm=3, atomic=True, maxnreg=168),
        Variant(64, 128, 64, 3, 4, sk_waves=2, per_sm=3),  # uncapped: 2 an SM
        Variant(64, 128, 64, 3, 4, sk_waves=2, per_sm=2),  # 264 programs, 2 an SM
        Variant(64, 128, 64, 3, 4, sk_waves=1, per_sm=3, maxnreg=168),  # 132 whole + 156 SK on 396
        Variant(64, 128, 64, 4, 4, sk_waves=2, per_sm=2),  # 4 stages (96 KiB): 2 an SM
        Variant(128, 128, 64, 3, 8, sk_waves=1, per_sm=2, maxnreg=128),  # 144 tiles SK over 264
    ],
}
CPU_VARIANTS = [  # every switch at least once; 16-wide K-steps make ranges that span three tiles
    Variant(32, 32, 16, 1, 4, sk_waves=1, two_kernels=True, atomic=True),
    Variant(32, 32, 16, 1, 4, sk_waves=1),
    Variant(32, 32, 32, 1, 4, sk_last=True),
    Variant(32, 32, 32, 1, 4, sk_waves=-1),
    Variant(32, 32, 16, 1, 4, sk_waves=2, per_sm=3),
]


def cpu_smoke() -> int:
    torch.manual_seed(0)
    failures = 0
    for m, n, k in ((97, 61, 45), (130, 68, 100)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for v in CPU_VARIANTS:
            runner = Runner(v, sm_count(), a.device)
            err, same = recording.checked_matmul(runner, a, b, splitk.reference)
            ok = err < 1e-5 and (same or v.atomic) and int(runner.tickets.abs().sum()) == 0
            failures += not ok
            print(f"{m}x{n}x{k} {v.name:24s} split {v.split(m, n, sm_count())} err {err:.1e} "
                  f"{'ok' if ok else 'WRONG'}")  # fmt: skip
    return int(failures > 0)


def gpu_main(out_dir: str, args) -> int:
    meta = recording.versioned()
    sms = sm_count()
    rows, failures = [], 0
    for (m, n, k), variants in (OCCUPANCY_SHAPES if args.occupancy else GPU_SHAPES).items():
        if args.m and m not in args.m:
            continue
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = splitk.reference(a, b)
        calls = {"cublas": lambda a=a, b=b: a @ b, "shipped": lambda a=a, b=b: splitk.matmul(a, b)}
        checks = {"shipped": (recording.rel_err(splitk.matmul(a, b), ref), True)}
        runners = {}
        for v in variants:
            runner = Runner(v, sms, a.device)
            try:
                checks[v.name] = (
                    (float("nan"), False)
                    if v.sk_alone
                    else recording.checked_matmul(runner, a, b, splitk.reference)
                )
            except Exception as e:  # out of resources, a compile error: the other variants still run
                print(f"{m}x{n}x{k} {v.name}: FAILED {e!r:.300}", flush=True)
                failures += 1
                continue
            runners[v.name] = runner
            compiled = getattr(runner, "compiled", None)
            if compiled is not None:
                print(f"{v.name}: {compiled.n_regs} registers, {compiled.n_spills} spills", flush=True)
            calls[v.name] = lambda r=runner, a=a, b=b, c=c: r(a, b, c)
        timed = recording.alternating_medians(calls, args.rounds, lambda call: graph_ms(call, rep=30))
        cublas = timed["cublas"][0]
        for name, (med, spread) in timed.items():
            err, same = checks.get(name, (0.0, True))
            v = next((v for v in variants if v.name == name), None)
            timing_only = v is not None and v.sk_alone  # C is not all written: nothing to check
            after = recording.rel_err(calls[name](), ref) if name in runners and not timing_only else err
            ok = timing_only or (err < 2e-2 and (same or v is None or v.atomic) and after < 2e-2)
            failures += not ok
            tiles, sk_tiles, _ = v.split(m, n, sms) if v else ("", "", "")
            rows.append(meta | {"m": m, "n": n, "k": k, "impl": name, "tiles": tiles, "sk_tiles": sk_tiles,
                                "sms": sms, "ms": med, "spread": spread,
                                "of_cublas": cublas / med, "rel_err": err, "bitwise_repeatable": same,
                                "rel_err_after_replays": after})  # fmt: skip
            print(f"{m}x{n}x{k} {name:26s} tiles {tiles!s:>4} sk {sk_tiles!s:>4} {med * 1e3:7.1f} us "
                  f"{cublas / med:.3f} of cuBLAS spread {spread:.2f} err {err:.1e}/{after:.1e} "
                  f"{'' if ok else 'WRONG'}", flush=True)  # fmt: skip
    recording.write_csv(f"{out_dir}/sk_tail.csv", rows)
    return int(failures > 0)


def _options(parser) -> None:
    parser.add_argument("--m", type=int, action="append", help="only the shapes of this M (repeatable)")
    parser.add_argument("--occupancy", action="store_true", help="the register-capped, 3-an-SM variants")


if __name__ == "__main__":
    recording.main(__doc__, cpu_smoke, gpu_main, "sk_tail", _options)
