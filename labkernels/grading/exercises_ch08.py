"""Chapter 08 exercises: the waits of a persistent ring whose tiles differ in length, the shared memory of an
FA3-style attention forward, the ring a TMA copy needs to hide a latency (Little's law), and a transpose
through shared memory written in Gluon.

The first three are arithmetic of the chapter's models, graded on fresh random inputs in both lanes. The
fourth is a kernel: Gluon kernels do not run under the interpreter, so it is graded on a Hopper GPU only, and
elsewhere its cases say so and count neither way. The chapter's models are off limits while an answer
runs; the references here build on them or on the rules each exercise states.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from labkernels import traffic
from labkernels.ch08_hopper import models
from labkernels.grading.core import CaseFailed, exercise

FORBIDS = ("labkernels.ch08_hopper.models",)


def _answers(student, arglist: list[tuple], show) -> list:
    """The answer on every argument tuple, in one round trip; at an error, the inputs that raised it."""
    try:
        return student.map(arglist)
    except CaseFailed as e:
        for args in arglist:  # find the inputs: one call each
            try:
                student(*args)
            except CaseFailed as one:
                raise CaseFailed(f"{show(args)}: {one}") from None
        raise CaseFailed(str(e)) from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _expect_value_error(g, student, args: tuple, show, why: str) -> None:
    try:
        got = student(*args)
    except CaseFailed as e:
        g.expect(str(e).startswith("ValueError"), f"{show(args)}: expected a ValueError ({why}), got {e}")
        return
    raise CaseFailed(f"{show(args)}: returned {got!r}; expected a ValueError ({why})")


# --- 8.1 the waits of a persistent ring ---------------------------------------------------------------------


def _waits_reference(k_steps: list[int], stages: int) -> list[list[tuple[int, int, int]]]:
    """The ring's position runs on over all of a program's tiles: it never restarts at a tile."""
    waits, it = [], 0
    for steps in k_steps:
        waits.append(
            [(models.ring_slot(i, stages), models.ready_parity(i, stages), models.empty_parity(i, stages))
             for i in range(it, it + steps)]
        )  # fmt: skip
        it += steps
    return waits


def _as_waits(got, k_steps: list[int], stages: int) -> list[list[tuple[int, int, int]]]:
    """The answer's table as tuples of ints, or a reason it is not one."""
    show = f"k_steps={k_steps}, stages={stages}"
    if not isinstance(got, list | tuple) or len(got) != len(k_steps):
        raise CaseFailed(f"{show}: return one list per tile ({len(k_steps)}), got {str(got)[:120]}")
    table = []
    for j, (tile, steps) in enumerate(zip(got, k_steps, strict=True)):
        if not isinstance(tile, list | tuple) or len(tile) != steps:
            raise CaseFailed(f"{show}: tile {j} has {steps} K steps; its list is {str(tile)[:120]}")
        for k, wait in enumerate(tile):
            if not (isinstance(wait, list | tuple) and len(wait) == 3 and all(_is_int(v) for v in wait)):
                raise CaseFailed(f"{show}: tile {j}, step {k}: return (slot, ready_parity, empty_parity) as "
                                 f"three ints, got {wait!r}")  # fmt: skip
        table.append([tuple(w) for w in tile])
    return table


def _compare_waits(got, want, k_steps: list[int], stages: int) -> None:
    for j, (mine, right) in enumerate(zip(got, want, strict=True)):
        for k, (a, b) in enumerate(zip(mine, right, strict=True)):
            if a != b:
                raise CaseFailed(
                    f"k_steps={k_steps}, stages={stages}: tile {j}, step {k}: got (slot, ready, empty) = "
                    f"{a}, expected {b}"
                )


def _simulate(g, table: list[list[tuple[int, int, int]]], stages: int, eager: float) -> str | None:
    """A producer and a consumer that wait with the answer's slots and parities on model mbarriers,
    interleaved at random (the producer moves with probability `eager` when both can). None if every item
    arrives in order; else what went wrong."""
    flat = [w for tile in table for w in tile]
    where = [(j, k) for j, tile in enumerate(table) for k in range(len(tile))]
    if any(not 0 <= slot < stages for slot, _, _ in flat):
        return f"a slot outside 0..{stages - 1}"
    ready = [models.MBarrier() for _ in range(stages)]
    empty = [models.MBarrier() for _ in range(stages)]
    buffers: list[int | None] = [None] * stages
    produced = consumed = 0
    while consumed < len(flat):
        can_produce = produced < len(flat) and empty[flat[produced][0]].passed(flat[produced][2])
        can_consume = ready[flat[consumed][0]].passed(flat[consumed][1])
        if not (can_produce or can_consume):
            producer = (
                "has finished"
                if produced == len(flat)
                else "waits at tile {} step {}".format(*where[produced])
            )
            consumer = "waits at tile {} step {}".format(*where[consumed])
            return f"deadlock: the producer {producer}, the consumer {consumer}"
        if can_produce and (not can_consume or g.random.random() < eager):
            slot = flat[produced][0]
            if buffers[slot] is not None:
                j, k = where[produced]
                return f"tile {j} step {k} was loaded over a buffer whose tile was not read yet (a race)"
            buffers[slot] = produced
            ready[slot].arrive()
            produced += 1
        else:
            slot = flat[consumed][0]
            if buffers[slot] != consumed:
                what = "an empty buffer" if buffers[slot] is None else "another step's tile"
                return "the consumer at tile {} step {} read {}".format(*where[consumed], what)
            buffers[slot] = None
            empty[slot].arrive()
            consumed += 1
    return None


@exercise("8.1", "The waits of a persistent ring", points=4, timeout_s=60, forbids=FORBIDS)
def _grade_8_1(student, g):
    # student(k_steps, stages) -> one list per tile of (slot, ready_parity, empty_parity), one per K step.
    def check_all(configs):
        got = _answers(student, configs, lambda a: f"k_steps={a[0]}, stages={a[1]}")
        for (k_steps, stages), answer in zip(configs, got, strict=True):
            table = _as_waits(answer, k_steps, stages)
            _compare_waits(table, _waits_reference(k_steps, stages), k_steps, stages)

    with g.case("one tile: the slot and both parities at every K step", points=1):
        check_all([([g.randint(1, 40)], g.randint(1, 8)) for _ in range(10)])
    with g.case("tiles of equal length, not a multiple of the ring: its position runs on across tiles",
                points=1):  # fmt: skip
        configs = []
        for _ in range(10):
            stages = g.randint(2, 6)
            steps = g.choice([s for s in range(1, 30) if s % (2 * stages)])
            configs.append(([steps] * g.randint(2, 6), stages))
        check_all(configs)
    with g.case("tiles of every length (causal block skipping), empty tiles, one stage, a ring longer "
                "than the work", points=1):  # fmt: skip
        configs = [([g.randint(0, 12) for _ in range(g.randint(2, 10))], g.randint(1, 7)) for _ in range(8)]
        configs.append(([g.randint(1, 9) for _ in range(g.randint(2, 5))], 1))
        configs.append(([0, g.randint(1, 5), 0, g.randint(1, 5)], g.randint(2, 4)))
        configs.append(([g.randint(1, 3) for _ in range(3)], g.randint(10, 16)))
        check_all(configs)
    with g.case("a producer and a consumer waiting with your parities deliver every tile in order, whatever "
                "their relative speed", points=1):  # fmt: skip
        configs = [([g.randint(0, 9) for _ in range(g.randint(1, 8))], g.randint(1, 5)) for _ in range(12)]
        got = _answers(student, configs, lambda a: f"k_steps={a[0]}, stages={a[1]}")
        for (k_steps, stages), answer in zip(configs, got, strict=True):
            table = _as_waits(answer, k_steps, stages)
            for eager in (0.1, 0.5, 0.9):
                problem = _simulate(g, table, stages, eager)
                g.expect(problem is None, f"k_steps={k_steps}, stages={stages}: {problem}")
            _compare_waits(table, _waits_reference(k_steps, stages), k_steps, stages)


# --- 8.2 the shared memory of an FA3-style forward ----------------------------------------------------------

BARRIERS_PER_STAGE = 3  # K ready, V ready, empty


def _attention_parts(block_m, block_n, head_dim, consumers, in_bytes, out_bytes, per_stage_barriers=True):
    """(fixed bytes, bytes per K/V stage): each consumer its own Q tile, O tile and Q barrier."""
    fixed = consumers * (block_m * head_dim * (in_bytes + out_bytes) + models.MBARRIER_BYTES)
    barriers = BARRIERS_PER_STAGE * models.MBARRIER_BYTES if per_stage_barriers else 0
    return fixed, 2 * block_n * head_dim * in_bytes + barriers


def _attention_problem(block_m, block_n, head_dim, consumers, in_bytes, out_bytes) -> str | None:
    """Why no kernel can use this tile (None: it is a tile; whether it fits is another question)."""
    values = dict(block_m=block_m, block_n=block_n, head_dim=head_dim, consumers=consumers)
    if any(not _is_int(v) or v < 1 for v in values.values()):
        return "a size below 1"
    if in_bytes not in (1, 2, 4) or out_bytes not in (1, 2, 4):
        return "an element size other than 1, 2 or 4 bytes"
    if block_m % 64:
        return "BLOCK_M not a multiple of 64, a warpgroup MMA's rows"
    if max(block_m, block_n, head_dim) > 256:
        return "a TMA box dimension above 256 elements"
    if head_dim * in_bytes % 16 or head_dim * out_bytes % 16:
        return "a box row (head_dim elements) that is not a multiple of 16 bytes"
    return None


def _attention_reference(*tile, budget=None, **kw) -> int:
    """The most K/V stages in one program's shared memory; < 2 means the tile is refused."""
    fixed, per_stage = _attention_parts(*tile, **kw)
    return max(0, ((budget or models.SMEM_PER_BLOCK) - fixed) // per_stage)


def _attention_tile(g, consumers=None, in_bytes=None, out_bytes=None) -> tuple:
    """A random tile that a kernel can use and that fits two stages or more."""
    while True:
        ib = in_bytes or g.choice([1, 2, 2, 4])
        ob = out_bytes or g.choice([1, 2, 2, 4])
        step = 16 // math.gcd(16, min(ib, ob))  # head_dim elements a 16-byte row holds at the narrower size
        args = (g.choice([64, 128, 192, 256]), 16 * g.randint(1, 16), step * g.randint(1, 256 // step),
                consumers or g.choice([1, 2]), ib, ob)  # fmt: skip
        if _attention_problem(*args) is None and _attention_reference(*args) >= 2:
            return args


def _show_attention(args) -> str:
    names = ("block_m", "block_n", "head_dim", "consumers", "in_bytes", "out_bytes")
    return ", ".join(f"{n}={v}" for n, v in zip(names, args, strict=True))


@exercise("8.2", "The shared memory of an FA3-style forward", points=4, timeout_s=60, forbids=FORBIDS)
def _grade_8_2(student, g):
    # student(block_m, block_n, head_dim, consumers, in_bytes, out_bytes) -> the most K/V stages; a
    # ValueError for a tile no kernel can use or that fits fewer than two stages.
    def check_all(tiles):
        got = _answers(student, tiles, _show_attention)
        for args, stages in zip(tiles, got, strict=True):
            want = _attention_reference(*args)
            g.expect(_is_int(stages) and stages == want, f"{_show_attention(args)}: got {stages!r} stages, "
                     f"expected {want}")  # fmt: skip

    def differing(count, **changed):
        """Tiles whose answer changes if one term of the budget is left out (or the per-SM 228 KB used)."""
        tiles = []
        while len(tiles) < count:
            args = _attention_tile(g)
            if _attention_reference(*args) != _attention_reference(*args, **changed):
                tiles.append(args)
        return tiles

    with g.case("bfloat16, one consumer warpgroup, random tiles", points=1):
        check_all([_attention_tile(g, consumers=1, in_bytes=2, out_bytes=2) for _ in range(15)])
    with g.case("two consumer warpgroups in ping-pong (a Q and an O tile each), fp8 and fp32 elements",
                points=1):  # fmt: skip
        tiles = [_attention_tile(g, consumers=2) for _ in range(10)]
        tiles += [_attention_tile(g, consumers=2, in_bytes=1, out_bytes=2) for _ in range(5)]
        check_all(tiles)
    with g.case("tiles where the barriers, or 227 KB a program rather than 228 KB an SM, decide",
                points=1):  # fmt: skip
        check_all(differing(6, per_stage_barriers=False) + differing(6, budget=models.SMEM_PER_SM))
    with g.case("impossible tiles are refused with a ValueError; tiles at the edge of every rule are not",
                points=1):  # fmt: skip
        edges = [(64, 256, 16, 1, 1, 1), (256, 16, 256, 1, 1, 1), (64, 16, 4, g.randint(1, 2), 4, 4)]
        while len(edges) < 6:  # exactly two stages fit
            tile = _attention_tile(g)
            if _attention_reference(*tile) == 2:
                edges.append(tile)
        check_all(edges)
        tile = _attention_tile(g)
        for args, why in [
            ((g.choice([32, 96, 160]), *tile[1:]), "BLOCK_M is not a multiple of 64"),
            ((tile[0], g.choice([272, 320, 512]), *tile[2:]), "a box of more than 256 rows"),
            ((*tile[:2], 16 * g.randint(1, 15) + 8, tile[3], 1, 2), "head_dim fp8 bytes not 16k bytes"),
            ((*tile[:4], 3, tile[5]), "no element is 3 bytes"),
            ((0, *tile[1:]), "BLOCK_M of 0"),
            ((256, 256, 256, 2, 4, 4), "not even the Q and O tiles fit"),
        ]:
            _expect_value_error(g, student, args, _show_attention, why)
        while _attention_problem(*tile) is not None or _attention_reference(*tile) != 1:
            tile = (g.choice([128, 192, 256]), 16 * g.randint(4, 16), 16 * g.randint(4, 16), g.choice([1, 2]),
                    g.choice([2, 4]), g.choice([2, 4]))  # fmt: skip
        _expect_value_error(g, student, tile, _show_attention, "only one stage fits: a ring needs two")


# --- 8.3 the ring a TMA copy needs --------------------------------------------------------------------------


def _copy_reads_per_stage(bandwidth_gbps, latency_ns, box_bytes, programs) -> Fraction:
    """Tiles each program must have requested and not yet received: (bandwidth / 2) x latency over all
    programs, in tiles; exact, so a case can stay clear of whole numbers."""
    return Fraction(bandwidth_gbps) * Fraction(latency_ns) / 2 / (programs * box_bytes)


def _copy_reference(bandwidth_gbps, latency_ns, rows, cols, element_bytes, sms, programs_per_sm) -> int:
    """Stages of each program's ring (0: it does not fit)."""
    box = rows * cols * element_bytes
    ahead = math.ceil(_copy_reads_per_stage(bandwidth_gbps, latency_ns, box, sms * programs_per_sm))
    stages = ahead + 1  # one more buffer: the tile whose TMA store is still reading it
    ring = stages * (box + models.MBARRIER_BYTES)
    fits = ring <= models.SMEM_PER_BLOCK and programs_per_sm * ring <= models.SMEM_PER_SM
    return stages if fits else 0


COPY_ARGS = (
    "bandwidth_gbps",
    "latency_ns",
    "box_rows",
    "box_cols",
    "element_bytes",
    "sms",
    "programs_per_sm",
)


def _show_copy(args) -> str:
    shown = (f"{v:.6g}" if isinstance(v, float) else f"{v}" for v in args)
    return ", ".join(f"{n}={v}" for n, v in zip(COPY_ARGS, shown, strict=True))


def _copy_case(g, h200=False, programs_per_sm=None, fits=True) -> tuple:
    """Random inputs whose tiles in flight are not within 1e-6 of a whole number (a float may round either way
    there) and whose ring fits (or, with fits=False, does not)."""
    while True:
        eb = g.choice([1, 2, 4])
        rows, cols = 2 ** g.randint(3, 8), max(16 // eb, 2 ** g.randint(3, 8))
        if h200:
            # from an idle memory system's latency to a loaded one's: one to several tiles in flight
            bandwidth, latency = g.randint(3800, 4600) + g.random.random(), g.randint(400, 4000) + 0.5
            sms, eb, rows, cols = 132, 2, 64, 128
        else:
            bandwidth, latency = g.randint(200, 9000) + g.random.random(), g.randint(100, 4000) + 0.5
            sms = g.randint(8, 160)
        ppsm = programs_per_sm or g.randint(1, 4)
        x = _copy_reads_per_stage(bandwidth, latency, rows * cols * eb, sms * ppsm)
        if abs(x - round(x)) < Fraction(1, 10**6) * max(1, x):
            continue
        args = (bandwidth, latency, rows, cols, eb, sms, ppsm)
        if (_copy_reference(*args) > 0) == fits:
            return args


@exercise("8.3", "The ring a TMA copy needs to hide a latency", points=4, timeout_s=60, forbids=FORBIDS)
def _grade_8_3(student, g):
    # student(bandwidth_gbps, latency_ns, box_rows, box_cols, element_bytes, sms, programs_per_sm) -> stages,
    # or ValueError when the rings do not fit.
    def check_all(cases):
        got = _answers(student, cases, _show_copy)
        for args, stages in zip(cases, got, strict=True):
            want = _copy_reference(*args)
            g.expect(_is_int(stages) and stages == want, f"{_show_copy(args)}: got {stages!r} stages, "
                     f"expected {want}")  # fmt: skip

    with g.case("an H200: 132 SMs, one program each, 64 x 128 bf16 boxes", points=1):
        cases = [_copy_case(g, h200=True, programs_per_sm=1) for _ in range(10)]
        while len({_copy_reference(*c) for c in cases}) < 3:  # never one answer for all: a constant fails
            cases[g.randint(0, 9)] = _copy_case(g, h200=True, programs_per_sm=1)
        check_all(cases)
    with g.case("several programs per SM share the bytes in flight", points=1):
        check_all([_copy_case(g, programs_per_sm=g.randint(2, 8)) for _ in range(12)])
    with g.case("random machines, boxes of 1-, 2- and 4-byte elements, a latency one tile hides",
                points=1):  # fmt: skip
        cases = [_copy_case(g) for _ in range(15)]
        bw, sms = g.randint(1000, 5000) + 0.5, g.randint(60, 140)
        cases.append((bw, g.randint(1, 20) + 0.25, 64, 64, 2, sms, 1))  # under one tile in flight: 2 stages
        check_all(cases)
    with g.case("the largest ring that fits is accepted; one stage more is refused with a ValueError",
                points=1):  # fmt: skip
        done = 0
        while done < 3:
            rows, cols, eb = 2 ** g.randint(5, 8), 2 ** g.randint(5, 8), g.choice([2, 4])
            box, ppsm, sms = rows * cols * eb, g.randint(1, 3), g.randint(60, 140)
            bw = g.randint(1000, 8000) + 0.5
            most = min(models.SMEM_PER_BLOCK // (box + 8), models.SMEM_PER_SM // (ppsm * (box + 8)))
            if most < 2:
                continue
            done += 1
            for stages in (most, most + 1):  # stages - 1 tiles ahead: ask for (stages - 1.5) tiles in flight
                latency = (stages - 1 - g.random.uniform(0.2, 0.8)) * sms * ppsm * box * 2 / bw
                args = (bw, latency, rows, cols, eb, sms, ppsm)
                if stages == most:
                    check_all([args])
                else:
                    _expect_value_error(g, student, args, _show_copy, "the rings do not fit in shared memory")
        args = _copy_case(g, fits=False)
        _expect_value_error(g, student, args, _show_copy, "the rings do not fit in shared memory")


# --- 8.4 a transpose through shared memory, in Gluon (Hopper only) -----------------------------------------


def _transpose_case(g, student, rows: int, cols: int, dtype) -> None:
    x = g.randn(rows, cols, dtype=dtype)
    out = g.guarded_empty((cols, rows), dtype)
    student(x, out)
    g.expect(torch.equal(out, x.t()), f"{rows} x {cols} {dtype}: out is not x transposed")


def _aligned(g, low: int, high: int, step: int) -> int:
    """A random multiple of `step` in [low, high] (TMA rows start on 16 bytes)."""
    return step * g.randint(-(-low // step), high // step)


@exercise(
    "8.4", "A transpose through shared memory, in Gluon", points=4, speed_points=2, timeout_s=300,
    requires="triton",
)  # fmt: skip
def _grade_8_4(student, g):
    # student(x, out): out (C, R) = x (R, C) transposed; both 2-D, contiguous, rows 16-byte aligned.
    with g.case("bfloat16, whole tiles", points=1, hopper_only=True):
        _transpose_case(g, student, _aligned(g, 256, 2048, 128), _aligned(g, 256, 2048, 128), torch.bfloat16)
    with g.case("float32, sizes that are not multiples of a tile", points=1, hopper_only=True):
        _transpose_case(
            g,
            student,
            _aligned(g, 100, 1000, 4),
            _aligned(g, 100, 1000, 4),
            torch.float32,
        )
    with g.case("float16, one tile or less", points=1, hopper_only=True):
        _transpose_case(g, student, 8 * g.randint(1, 8), 8 * g.randint(1, 8), torch.float16)
    with g.case("tall and skinny, both ways", points=1, hopper_only=True):
        _transpose_case(g, student, 8 * g.randint(1000, 3000), 8, torch.bfloat16)
        _transpose_case(g, student, 8, 8 * g.randint(1000, 3000), torch.bfloat16)
    with g.case(
        "bandwidth >= 60% of copy at 8192 x 8192 bfloat16", points=2, gpu_only=True, hopper_only=True
    ):
        x = g.randn(8192, 8192, dtype=torch.bfloat16)
        out = g.guarded_empty((8192, 8192), torch.bfloat16)
        student(x, out)
        g.expect(torch.equal(out, x.t()), "8192 x 8192: out is not x transposed")
        moved = traffic.Traffic("transpose", 2 * x.numel() * x.element_size(), 0)  # read n, write n
        g.expect_bandwidth(
            lambda: student(x, out),
            moved,
            fraction=0.6,
            check=lambda x, out: g.expect(torch.equal(out, x.t()), "a timed call did not transpose x"),
        )
