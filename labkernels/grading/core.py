"""What an exercise's grading function works with: cases, fresh random inputs, poisoned and guarded outputs.

A grading function runs in the grading process; it receives the learner's answer as a proxy (`remote.Student`:
each call runs in a worker process that never sees a reference or a score) and a `Grader`, and opens one
`case` per thing it checks. Any exception inside a case fails that case and its message becomes the reason
shown to the learner; the next case still runs. Inputs, references and comparisons all live here: the worker
gets copies of the inputs and sends back what the answer wrote into the outputs.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
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
    # What the answer must be built from: "triton" (its own Triton kernel ran, no torch compute op), "cpp"
    # (its own C++ op, no torch compute op), or None (any Python). Checked on every call of the answer.
    requires: str | None = None
    # Modules of the course whose functions compute this exercise's answer: a call into one of them while the
    # answer runs refuses that call (the formula is the learner's to write, not to import).
    forbids: tuple[str, ...] = ()

    @property
    def chapter(self) -> str:
        return self.ex_id.split(".")[0].zfill(2)


EXERCISES: dict[str, Exercise] = {}


def exercise(
    ex_id: str,
    title: str,
    *,
    points: float,
    speed_points: float = 0,
    timeout_s: float = 180,
    requires: str | None = None,
    forbids: tuple[str, ...] = (),
):
    """Register a grading function for exercise `ex_id` ("3.1")."""
    if requires not in (None, "triton", "cpp"):
        raise ValueError(f"exercise {ex_id}: requires must be None, 'triton' or 'cpp', not {requires!r}")

    def register(fn: Callable[[object, Grader], None]):
        if ex_id in EXERCISES and EXERCISES[ex_id].grade.__qualname__ != fn.__qualname__:
            raise ValueError(f"exercise {ex_id} registered twice")
        forbidden = tuple(forbids)
        EXERCISES[ex_id] = Exercise(ex_id, title, points, speed_points, fn, timeout_s, requires, forbidden)
        return fn

    return register


# Canary written around guarded outputs: an unmasked store past the end changes it.
_CANARY = {torch.float32: -7777.25, torch.float64: -7777.25, torch.float16: -777.5, torch.bfloat16: -776.0}
_INT_CANARY = -7777


class Grader:
    """Collects case results; holds the inputs, the references and the comparisons (the answer is remote)."""

    def __init__(self, speed: bool = False, lane: str = LANE):
        self.lane = lane
        self.student = None  # the remote.Student proxy, set by the runner
        self.current_case: str | None = None
        self.speed = speed  # True: run only the gpu_only cases; False: only the correctness cases
        self.results: list[dict] = []
        seed = int.from_bytes(os.urandom(8), "little") >> 1  # fresh inputs at every grading
        self.random = random.Random(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self._guards: list[tuple[torch.Tensor, int, int, float]] = []
        self._outputs: list[torch.Tensor] = []  # tensors the answer writes: copied back from the worker
        self._copy_gbps: float | None = None
        self._skipping = False

    # --- cases ------------------------------------------------------------------------------------------
    def _cannot_grade_here(self, gpu_only: bool, hopper_only: bool) -> str | None:
        """Why this machine cannot grade such a case, or None."""
        if hopper_only and not self._on_hopper():
            return "graded on a Hopper GPU only: Gluon kernels need one (no interpreter, no other GPU)"
        if gpu_only and self.lane != "gpu":
            return "graded on the GPU lane only: on the CPU lane there is no GPU to time"
        return None

    def _on_hopper(self) -> bool:
        if self.lane != "gpu":
            return False
        from labkernels.ch08_hopper.device import hopper_problem

        return hopper_problem(torch.device(DEVICE)) is None

    @contextlib.contextmanager
    def case(self, name: str, points: float, gpu_only: bool = False, hopper_only: bool = False):
        """One graded case; yields True when its body is graded. A correctness run skips gpu_only cases
        and a speed run skips the others: a skipped body stops at its first grader call (`_Skip`).
        hopper_only: a case about a Gluon kernel, graded on a Hopper GPU only; elsewhere it is skipped and
        says why, and its points leave the possible total."""
        graded_in_this_run = gpu_only == self.speed
        why_not = self._cannot_grade_here(gpu_only, hopper_only)
        if graded_in_this_run and why_not:
            self._record(
                {
                    "case": name,
                    "points": points,
                    "gpu_only": gpu_only,
                    "status": "skip",
                    "earned": 0,
                    "reason": why_not,
                }
            )
        if not graded_in_this_run or why_not:
            self._skipping = True
            try:
                yield False
            except Exception:  # noqa: S110  (a body that is not graded in this run may stop anywhere)
                pass
            finally:
                self._skipping = False
            return
        self._guards.clear()
        self._outputs.clear()
        self.current_case = name
        result = {"case": name, "points": points, "gpu_only": gpu_only}
        try:
            yield True
            self.check_guards()
        except Exception as e:  # the learner's code may raise anything: it costs the case, never the run
            result.update(status="fail", earned=0, reason=_reason(e))
        else:
            result.update(status="pass", earned=points, reason="")
        self.current_case = None
        self._record(result)

    def _record(self, result: dict) -> None:
        self.results.append({"event": "case", **result})

    def output(self, t: torch.Tensor) -> torch.Tensor:
        """Mark `t` as an output of the answer: what the answer writes into it is copied back here."""
        self._outputs.append(t)
        return t

    def output_storages(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self._outputs}

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
        self._outputs.append(buffer)
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
        self._not_skipping()
        if self._copy_gbps is None:
            from labkernels.roofline import measure_copy_bandwidth

            self._copy_gbps = measure_copy_bandwidth()
        return self._copy_gbps

    def time_answer(self, fn: Callable[[], object], check: Callable[..., None] | None = None) -> float:
        """Median ms of the answer's call that `fn` makes (`lambda: student(x, y, out)`), each timed
        repetition on fresh inputs it has never seen (so a memo of an earlier result cannot help); a sample of
        the timed repetitions' outputs is then read back and checked: written everywhere, and `check(*args)`
        (the same call's arguments, this repetition's tensors) passes. On the GPU lane a Triton exercise's
        answer is timed by the grader's replay of its kernels (`_time_replayed`)."""
        self._not_skipping()
        with self.student.capturing() as calls:
            fn()
        if len(calls) != 1:
            raise RuntimeError(f"time_answer: fn must call the answer once, it called it {len(calls)} times")
        args, kwargs = calls[0]
        template = _tensors_in((args, kwargs))
        outputs = self.output_storages()
        is_out = [t.untyped_storage().data_ptr() in outputs for t in template]
        if not any(is_out):
            raise RuntimeError("time_answer: the call has no output tensor (use guarded_empty or g.output)")
        warmup, reps = (5, 20) if self.lane == "gpu" else (1, 3)
        seed = self.random.getrandbits(31)
        picks = sorted(self.random.sample(range(warmup, warmup + reps), k=min(3, reps)))
        if self.lane == "gpu" and self.student.requires == "triton":
            times, backs = self._time_replayed(args, kwargs, is_out, seed, warmup, reps, picks)
        else:  # the answer's own worker holds the clock (an exercise whose answer is not a Triton kernel)
            times = self.student.time(args, kwargs, is_out, seed=seed, warmup=warmup, reps=reps)
            backs = self.student.fetch(picks)
        if len(times) != reps or not all(isinstance(t, float) and t > 0 for t in times):
            raise CaseFailed("the timed calls did not all complete")
        for pick, back in zip(picks, backs, strict=True):
            self.check_variant(args, kwargs, is_out, seed, pick, back, check)
        return statistics.median(times)

    def _time_replayed(self, args, kwargs, is_out, seed, warmup, reps, picks):
        """A Triton answer's time, taken outside its process: its launches are recorded in its worker, then
        replayed on fresh inputs by a worker that runs none of its Python (`replay`)."""
        record = self.student.record(args, kwargs)
        timer = self.student.replayed(record)
        try:
            times = timer.time(args, kwargs, is_out, seed=seed, warmup=warmup, reps=reps, keep=picks)
            return times, timer.fetch(picks)
        finally:
            timer.close()

    def check_variant(self, args, kwargs, is_out, seed, index, outs, check) -> None:
        """Check timed repetition `index`: its outputs `outs` (read back) against its inputs (regenerated)."""
        from labkernels.grading.child import replace_tensors

        template = _tensors_in((args, kwargs))
        tensors = make_variants(template, is_out, index + 1, seed, only=index)[0]
        mine = [t for t, out in zip(tensors, is_out, strict=True) if out]
        if len(outs) != len(mine):
            raise CaseFailed("a timed repetition's outputs did not come back")
        it = iter(outs)
        for k, out in enumerate(is_out):
            if out:
                theirs = next(it)
                if not isinstance(theirs, torch.Tensor) or theirs.shape != tensors[k].shape:
                    raise CaseFailed("a timed repetition's output came back with another shape")
                tensors[k] = theirs.to(tensors[k].device)
                if tensors[k].is_floating_point() and bool(torch.isnan(tensors[k]).any()):
                    raise CaseFailed(
                        f"timed repetition {index}: the output was not fully written (fresh inputs each "
                        "repetition: an answer that reuses an earlier result fails here)"
                    )
        if check is not None:
            (a, kw), _ = replace_tensors((args, kwargs), tensors)
            try:
                check(*a, **kw)
            except CaseFailed as e:
                raise CaseFailed(f"timed repetition {index} (fresh inputs): {e}") from None

    def expect_bandwidth(
        self, fn: Callable[[], object], traffic, fraction: float, check: Callable[..., None] | None = None
    ) -> float:
        """Time the answer's call in `fn` (GPU lane; see `time_answer`) and require traffic.bytes / time >=
        fraction × measured copy bandwidth."""
        self._not_skipping()
        from labkernels import timing

        ms = self.time_answer(fn, check)
        achieved = timing.gbps(traffic.bytes, ms)
        ceiling = self.copy_bandwidth()
        self.expect(
            achieved >= fraction * ceiling,
            f"{achieved:.0f} GB/s is {achieved / ceiling:.0%} of the measured copy bandwidth "
            f"{ceiling:.0f} GB/s; needs {fraction:.0%}",
        )
        return achieved


def _tensors_in(obj) -> list[torch.Tensor]:
    from labkernels.grading.child import tensors_in

    return tensors_in(obj)


def make_variants(template: list, is_out: list[bool], count: int, seed: int, only: int | None = None) -> list:
    """`count` fresh sets of tensors shaped (and strided) like `template`: inputs with new random values,
    outputs with NaN. Set i depends only on (seed, i), so the grader regenerates any set the worker timed.
    With `only`, just that set is built (returned as a one-element list)."""
    sets = []
    for i in range(count) if only is None else [only]:
        tensors = []
        for j, (t, out) in enumerate(zip(template, is_out, strict=True)):
            fresh = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
            if out:
                fresh.fill_(float("nan") if t.dtype.is_floating_point else -1)
            else:
                gen = torch.Generator(device=t.device).manual_seed((seed * 1_000_003 + i * 1009 + j) % 2**63)
                if t.dtype.is_floating_point:
                    values = torch.randn(tuple(t.shape), generator=gen, device=t.device, dtype=torch.float32)
                else:
                    values = torch.randint(-100, 100, tuple(t.shape), generator=gen, device=t.device)
                fresh.copy_(values.to(t.dtype))
            tensors.append(fresh)
        sets.append(tensors)
    return sets


class _Skip(Exception):
    pass


def _reason(e: BaseException) -> str:
    if isinstance(e, CaseFailed):
        return str(e)
    text = str(e).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:300]
