"""The arithmetic behind Hopper's asynchronous pipelines, in plain Python: both lanes run it.

- Little's law: to stream at bandwidth B through a memory with latency L, B x L bytes must be in flight.
  A pipeline gets them in flight with stages: each program keeps `stages` tiles requested ahead.
- Shared memory: every stage holds its tiles in shared memory; 227 KB per program (H100/H200) caps
  stages x tile bytes.
- mbarrier phases: a ring of N buffers, each guarded by a "ready" and an "empty" barrier; at iteration i the
  consumer waits for parity (i // N) & 1 of ready[i % N], the producer for the opposite parity of empty.
- Persistent schedule: one program per SM loops over output tiles in grouped order.

The kernels in this chapter (`copy.py`, `gemm.py`) use the same formulas, and the tests check both against
hand-worked cases.
"""

from __future__ import annotations

import math
import random

SMEM_PER_SM = 228 * 1024  # bytes of shared memory per SM on an H100/H200
SMEM_PER_BLOCK = 227 * 1024  # the most one program (thread block) may allocate
MBARRIER_BYTES = 8  # an mbarrier is one 64-bit word in shared memory


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


# --- Little's law -------------------------------------------------------------------------------------------


def bytes_in_flight(bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Bytes that must be requested and not yet delivered to sustain `bandwidth` over `latency`: B x L."""
    _positive(bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s)
    return bandwidth_bytes_per_s * latency_s


def stages_to_hide_latency(
    bandwidth_bytes_per_s: float, latency_s: float, bytes_per_stage: int, programs: int
) -> int:
    """Stages each of `programs` concurrent programs must keep in flight, `bytes_per_stage` each, so that all
    of them together hold B x L bytes requested: ceil(B x L / (programs x bytes_per_stage)). A ring needs one
    more buffer than this, for the stage being consumed while the others load."""
    _positive(bytes_per_stage=bytes_per_stage, programs=programs)
    return math.ceil(bytes_in_flight(bandwidth_bytes_per_s, latency_s) / (programs * bytes_per_stage))


# --- shared-memory budget -----------------------------------------------------------------------------------


def gemm_stage_bytes(block_m: int, block_n: int, block_k: int, element_bytes: int = 2) -> int:
    """One stage of a GEMM pipeline: a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B."""
    _positive(block_m=block_m, block_n=block_n, block_k=block_k, element_bytes=element_bytes)
    return (block_m * block_k + block_k * block_n) * element_bytes


def gemm_smem_bytes(
    block_m: int, block_n: int, block_k: int, stages: int, element_bytes: int = 2, out_bytes: int = 2
) -> int:
    """Shared memory of the warp-specialized GEMM: `stages` operand stages, one BLOCK_M x BLOCK_N output tile
    for the TMA store, and two mbarriers (ready, empty) per stage."""
    _positive(stages=stages, out_bytes=out_bytes)
    operands = stages * gemm_stage_bytes(block_m, block_n, block_k, element_bytes)
    return operands + block_m * block_n * out_bytes + 2 * stages * MBARRIER_BYTES


def copy_smem_bytes(block_rows: int, block_cols: int, stages: int, element_bytes: int) -> int:
    """Shared memory of the pipelined copy: `stages` tiles and one mbarrier per stage."""
    _positive(block_rows=block_rows, block_cols=block_cols, stages=stages, element_bytes=element_bytes)
    return stages * (block_rows * block_cols * element_bytes + MBARRIER_BYTES)


def max_gemm_stages(
    block_m: int,
    block_n: int,
    block_k: int,
    element_bytes: int = 2,
    out_bytes: int = 2,
    budget: int = SMEM_PER_BLOCK,
) -> int:
    """The most stages whose shared memory fits in `budget` bytes (0 if not even one does)."""
    fixed = block_m * block_n * out_bytes
    per_stage = gemm_stage_bytes(block_m, block_n, block_k, element_bytes) + 2 * MBARRIER_BYTES
    return max(0, (budget - fixed) // per_stage)


# --- mbarrier phases for a ring of buffers ------------------------------------------------------------------


def ring_slot(iteration: int, stages: int) -> int:
    """The buffer (and barrier pair) iteration `iteration` uses: the ring wraps every `stages` iterations."""
    _check_iteration(iteration, stages)
    return iteration % stages


def ready_parity(iteration: int, stages: int) -> int:
    """The parity the consumer waits for on ready[slot]: the slot's k-th use (k = iteration // stages) waits
    for the k-th completion of its barrier, whose phase parity is k & 1."""
    _check_iteration(iteration, stages)
    return (iteration // stages) & 1


def empty_parity(iteration: int, stages: int) -> int:
    """The parity the producer waits for on empty[slot]: the opposite of the consumer's. A fresh mbarrier
    counts as having completed a phase of parity 1, so the first lap (parity 1) passes at once: every buffer
    starts empty."""
    return ready_parity(iteration, stages) ^ 1


def _check_iteration(iteration: int, stages: int) -> None:
    if not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0, got {iteration!r}")
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")


class MBarrier:
    """An mbarrier as the hardware keeps it: a phase counter and the arrivals still pending in this phase.
    `passed(parity)` is `mbarrier.try_wait.parity`: true once the most recent phase of that parity has
    completed (for a fresh barrier, parity 1: the phase "before" phase 0)."""

    def __init__(self, count: int = 1):
        _positive(count=count)
        self.count = count
        self.phase = 0
        self.pending = count

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:  # the phase completes and the next one begins
            self.phase += 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        return (self.phase & 1) != parity


def simulate_ring(
    iterations: int, stages: int, seed: int = 0, ready=ready_parity, empty=empty_parity
) -> list[int]:
    """Run a producer and a consumer through a ring of `stages` buffers for `iterations` items, interleaved at
    random (a seeded stand-in for two warps' relative speed), waiting with the parities `ready` and `empty`
    give. Returns the items in the order the consumer read them; raises if both block (a deadlock) or if the
    producer overwrites a buffer the consumer has not read (a race)."""
    rng = random.Random(seed)
    ready_bars = [MBarrier() for _ in range(stages)]
    empty_bars = [MBarrier() for _ in range(stages)]
    buffers: list[int | None] = [None] * stages
    produced = consumed = 0
    read: list[int] = []
    while consumed < iterations:
        slot_p, slot_c = produced % stages, consumed % stages
        can_produce = produced < iterations and empty_bars[slot_p].passed(empty(produced, stages))
        can_consume = ready_bars[slot_c].passed(ready(consumed, stages))
        if not (can_produce or can_consume):
            raise RuntimeError(f"deadlock: producer at {produced}, consumer at {consumed}")
        if can_produce and (not can_consume or rng.random() < 0.5):
            if buffers[slot_p] is not None:
                raise RuntimeError(f"race: item {produced} overwrote unread item {buffers[slot_p]}")
            buffers[slot_p] = produced  # the TMA load lands, then the barrier's transaction count completes
            ready_bars[slot_p].arrive()
            produced += 1
        else:
            read.append(buffers[slot_c])
            buffers[slot_c] = None
            empty_bars[slot_c].arrive()  # the consumer releases the buffer
            consumed += 1
    return read


# --- persistent tile schedule -------------------------------------------------------------------------------


def grouped_tile(tile: int, num_m: int, num_n: int, group_m: int) -> tuple[int, int]:
    """(pid_m, pid_n) of output tile `tile` in grouped order: ids run down `group_m` rows of tiles before
    moving one column right, so consecutive tiles share columns of B in L2 (chapter 03's ordering)."""
    _positive(num_m=num_m, num_n=num_n, group_m=group_m)
    if not 0 <= tile < num_m * num_n:
        raise ValueError(f"tile must be in [0, {num_m * num_n}), got {tile}")
    tiles_per_group = group_m * num_n
    first_m = (tile // tiles_per_group) * group_m
    rows = min(num_m - first_m, group_m)  # the last group may be short
    return first_m + (tile % tiles_per_group) % rows, (tile % tiles_per_group) // rows


def persistent_schedule(num_tiles: int, programs: int) -> list[list[int]]:
    """The tiles each of `programs` persistent programs computes, in order: program p takes tiles p,
    p + programs, p + 2 * programs, ... (the kernel's `range(pid, num_tiles, num_programs)`)."""
    _positive(programs=programs)
    if num_tiles < 0:
        raise ValueError(f"num_tiles must be >= 0, got {num_tiles}")
    return [list(range(p, num_tiles, programs)) for p in range(programs)]


def wave_efficiency(num_tiles: int, programs: int) -> float:
    """Busy fraction of the programs when every tile costs the same: tiles / (waves x programs). 1.0 when the
    tiles divide evenly; below it, the last wave leaves programs idle."""
    _positive(num_tiles=num_tiles, programs=programs)
    return num_tiles / (math.ceil(num_tiles / programs) * programs)
