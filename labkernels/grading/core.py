"""What an exercise's grading function works with: cases, fresh random inputs, poisoned and guarded outputs.

A grading function runs inside a sandboxed child process (see `sandbox`); it receives the learner's answer
and a `Grader`, and opens one `case` per thing it checks. Any exception inside a case fails that case and
its message becomes the reason shown to the learner; the next case still runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkernels.lane import DEVICE, LANE


class CaseFailed(Exception):
    """Raised by the grader's checks; its message is the reason the learner reads."""


@dataclass
class Exercise:
    ex_id: str
    title: str
    points: float  # correctness points (lane-independent)
    speed_points: float  # GPU-lane performance points (skipped on the CPU lane)
    grade: Callable[[object, Grader], None]
    timeout_s: float

    @property
    def chapter(self) -> str:
        return self.ex_id.split(".")[0].zfill(2)


EXERCISES: dict[str, Exercise] = {}


def exercise(ex_id: str, title: str, *, points: float, speed_points: float = 0, timeout_s: float = 180):
    """Register a grading function for exercise `ex_id` ("3.1")."""

    def register(fn: Callable[[object, Grader], None]):
        if ex_id in EXERCISES and EXERCISES[ex_id].grade.__qualname__ != fn.__qualname__:
            raise ValueError(f"exercise {ex_id} registered twice")
        EXERCISES[ex_id] = Exercise(ex_id, title, points, speed_points, fn, timeout_s)
        return fn

    return register


# Canary written around guarded outputs: an unmasked store past the end changes it.
_CANARY = {torch.float32: -7777.25, torch.float64: -7777.25, torch.float16: -777.5, torch.bfloat16: -776.0}
_INT_CANARY = -7777


class Grader:
    """Collects case results (streamed to `results_path` as JSON lines so a crash keeps what was graded)."""

    def __init__(self, results_path: str | None = None, speed: bool = False):
        self.results_path = results_path
        self.speed = speed  # True: run only the gpu_only cases; False: only the correctness cases
        self.results: list[dict] = []
        seed = int.from_bytes(os.urandom(8), "little") >> 1  # fresh inputs at every grading
        self.random = random.Random(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self._guards: list[tuple[torch.Tensor, int, int, float]] = []
        self._copy_gbps: float | None = None
        self._skipping = False

    # --- cases ------------------------------------------------------------------------------------------
    def _emit(self, record: dict) -> None:
        if self.results_path:
            with open(self.results_path, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())

    @contextlib.contextmanager
    def case(self, name: str, points: float, gpu_only: bool = False):
        """One graded case; yields True when its body is graded. A correctness run skips gpu_only cases
        and a speed run skips the others: a skipped body stops at its first grader call (`_Skip`)."""
        graded_in_this_run = gpu_only == self.speed
        if graded_in_this_run and gpu_only and LANE != "gpu":
            reason = "skipped on the CPU lane: interpreter timings say nothing about a GPU"
            self._record(
                {
                    "case": name,
                    "points": points,
                    "gpu_only": True,
                    "status": "skip",
                    "earned": 0,
                    "reason": reason,
                }
            )
        if not graded_in_this_run or (gpu_only and LANE != "gpu"):
            self._skipping = True
            try:
                yield False
            except Exception:  # noqa: S110  (a body that is not graded in this run may stop anywhere)
                pass
            finally:
                self._skipping = False
            return
        self._guards.clear()
        self._emit({"event": "start", "case": name})
        result = {"case": name, "points": points, "gpu_only": gpu_only}
        try:
            yield True
            self.check_guards()
        except Exception as e:  # the learner's code may raise anything: it costs the case, never the run
            result.update(status="fail", earned=0, reason=_reason(e))
        else:
            result.update(status="pass", earned=points, reason="")
        self._record(result)

    def _record(self, result: dict) -> None:
        result = {"event": "case", **result}
        self.results.append(result)
        self._emit(result)

    def _not_skipping(self) -> None:
        if self._skipping:
            raise _Skip

    def expect(self, condition: bool, reason: str) -> None:
        self._not_skipping()
        if not condition:
            raise CaseFailed(reason)

    # --- inputs -----------------------------------------------------------------------------------------
    def randint(self, low: int, high: int) -> int:
        """A random int in [low, high]."""
        self._not_skipping()
        return self.random.randint(low, high)

    def choice(self, seq):
        self._not_skipping()
        return self.random.choice(list(seq))

    def randn(self, *shape, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        self._not_skipping()
        t = torch.randn(*shape, generator=self.generator, dtype=torch.float32)
        return t.to(dtype).to(device or DEVICE)

    def guarded_empty(self, shape, dtype: torch.dtype = torch.float32, device=None, guard: int = 16384):
        """An output tensor poisoned with NaN (or -1 for ints), inside a buffer whose `guard` elements on each
        side hold a canary: `check_guards` (run after every case) fails the case if any canary changed."""
        self._not_skipping()
        shape = tuple(shape)
        numel = math.prod(shape)
        canary = _CANARY.get(dtype, _INT_CANARY)
        buffer = torch.full((guard + numel + guard,), canary, dtype=dtype, device=device or DEVICE)
        out = buffer[guard : guard + numel].view(shape)
        out.fill_(float("nan") if dtype.is_floating_point else -1)
        self._guards.append((buffer, guard, numel, canary))
        return out

    def check_guards(self) -> None:
        for buffer, guard, numel, canary in self._guards:
            before, after = buffer[:guard], buffer[guard + numel :]
            bad_before = int((before != canary).sum())
            bad_after = int((after != canary).sum())
            if bad_before or bad_after:
                raise CaseFailed(
                    f"wrote outside the output: {bad_before} elements before it and {bad_after} after it "
                    "changed (a missing or wrong mask?)"
                )

    # --- checks -----------------------------------------------------------------------------------------
    def check_close(self, actual, expected: torch.Tensor, *, atol: float, rtol: float) -> None:
        self._not_skipping()
        if not isinstance(actual, torch.Tensor):
            raise CaseFailed(f"expected a tensor, got {type(actual).__name__}")
        if tuple(actual.shape) != tuple(expected.shape):
            raise CaseFailed(f"wrong shape: expected {tuple(expected.shape)}, got {tuple(actual.shape)}")
        actual = actual.detach().to("cpu", torch.float64)
        expected = expected.detach().to("cpu", torch.float64)
        unwritten = int((torch.isnan(actual) & ~torch.isnan(expected)).sum())
        if unwritten:
            raise CaseFailed(
                f"{unwritten} of {actual.numel()} output elements were never written (still NaN)"
            )
        try:
            torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
        except AssertionError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            raise CaseFailed("wrong values: " + "; ".join(lines[:3])) from None

    def copy_bandwidth(self) -> float:
        if self._copy_gbps is None:
            from labkernels.roofline import measure_copy_bandwidth

            self._copy_gbps = measure_copy_bandwidth()
        return self._copy_gbps

    def expect_bandwidth(self, fn: Callable[[], object], traffic, fraction: float) -> float:
        """Time `fn` (GPU lane) and require traffic.bytes / time >= fraction × measured copy bandwidth."""
        self._not_skipping()
        from labkernels import timing

        ms = timing.time_ms(fn)
        achieved = timing.gbps(traffic.bytes, ms)
        ceiling = self.copy_bandwidth()
        self.expect(
            achieved >= fraction * ceiling,
            f"{achieved:.0f} GB/s is {achieved / ceiling:.0%} of the measured copy bandwidth "
            f"{ceiling:.0f} GB/s; needs {fraction:.0%}",
        )
        return achieved


class _Skip(Exception):
    pass


def _reason(e: BaseException) -> str:
    if isinstance(e, CaseFailed):
        return str(e)
    text = str(e).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:300]
