"""Chapter 01 exercises: a dtype-generic C++ op with input checks, predicting rebuilds, and an op that
torch.compile can trace.

The C++ exercises run on CPU tensors in both lanes (the learner writes a CPU implementation), so their
verdicts are the same everywhere. Sources are built in the grading process with
`labkernels.ch01_jit.diagnostics.build_inline` under a name unique to the source: a compile error fails the
case with the compiler's first error (and its line) as the reason.
"""

from __future__ import annotations

import torch

from labkernels.ch01_jit import diagnostics
from labkernels.ch01_jit.rebuild import CHAPTER_EDITS, measure_rebuilds, rebuild_facts, scenarios
from labkernels.grading.core import CaseFailed, exercise

CPU = torch.device("cpu")

# Tolerances against a float64 reference: float32 and float64 round once; half and bfloat16 round the result.
TOL = {
    torch.float32: (1e-6, 1e-6),
    torch.float64: (1e-12, 1e-12),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def _odd(g, low: int, high: int) -> int:
    n = g.randint(low, high)
    return n if n % 16 else n + 7


def _source(student) -> str:
    """The answer may be the source itself or a function returning it."""
    source = student() if callable(student) else student
    if not isinstance(source, str):
        raise CaseFailed(f"the answer must be C++ source as a str, got {type(source).__name__}")
    return source


def clamp_scale_reference(x: torch.Tensor, lo: float, hi: float, scale: float) -> torch.Tensor:
    """scale * clamp(x, lo, hi), in float64."""
    return x.double().clamp(lo, hi) * scale


def _expect_raises(g, fn, what: str) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001  (any Python exception is a clean rejection; a crash is not)
        return
    raise CaseFailed(f"{what}: expected an error (TORCH_CHECK), but the call returned")


@exercise("1.1", "A dtype-generic C++ op that checks its inputs", points=6, timeout_s=300, requires="cpp")
def _grade_1_1(student, g):
    module = None

    def one(shape, dtype, x=None):
        if module is None:
            raise CaseFailed("the source did not build")
        lo = -g.randint(1, 20) / 10
        hi = g.randint(1, 20) / 10
        scale = g.randint(-30, 30) / 7
        x = (g.randn(*shape, device=CPU) * 2).to(dtype) if x is None else x
        out = module.clamp_scale(x, lo, hi, scale)
        if not isinstance(out, torch.Tensor):
            raise CaseFailed(f"clamp_scale must return a tensor, got {type(out).__name__}")
        g.expect(out.dtype == dtype, f"a {dtype} input must give a {dtype} output, got {out.dtype}")
        g.expect(out.data_ptr() != x.data_ptr() or x.numel() == 0, "clamp_scale must return a new tensor")
        atol, rtol = TOL[dtype]
        g.check_close(out, clamp_scale_reference(x, lo, hi, scale), atol=atol, rtol=rtol)

    # Every case's points need right values: an op that only checks its inputs (or returns garbage) earns
    # neither "builds" nor "rejects bad input".
    with g.case("the source builds, defines clamp_scale and computes it (small float32 x)", points=1):
        source = _source(student)
        # Built and run in the worker (the learner's C++ never runs in the grading process); a compile error
        # comes back as the compiler's first error and its line.
        module = student.build_inline("ex1_1", source, functions=["clamp_scale"])
        one((_odd(g, 10, 100),), torch.float32)
    with g.case("float32 at a size that is a multiple of nothing", points=1):
        one((_odd(g, 1000, 200_000),), torch.float32)
    with g.case("float64, float16 and bfloat16", points=1):
        for dtype in (torch.float64, torch.float16, torch.bfloat16):
            one((_odd(g, 100, 50_000),), dtype)
    with g.case("empty, one-element and 2-D tensors", points=1):
        one((0,), torch.float32)
        one((1,), torch.float32)
        one((g.randint(2, 40), _odd(g, 10, 300)), torch.float32)
    with g.case(
        "rejects bad input with an error (int tensor, non-contiguous tensor, lo > hi), and computes the same "
        "input made valid",
        points=2,
    ):
        if module is None:
            raise CaseFailed("the source did not build")
        n = _odd(g, 100, 1000)
        ints = torch.randint(-5, 5, (n,), dtype=torch.int32, generator=g.generator)
        wide = g.randn(g.randint(3, 30), _odd(g, 20, 200), device=CPU)
        # Each bad input's valid twin first: rejecting everything is not checking.
        one(None, torch.float32, x=ints.float())
        one(None, torch.float32, x=wide.t().contiguous())
        one(None, torch.float32, x=wide[:, ::2].contiguous())
        _expect_raises(g, lambda: module.clamp_scale(ints, -1.0, 1.0, 2.0), "an int32 tensor")
        _expect_raises(
            g, lambda: module.clamp_scale(wide.t(), -1.0, 1.0, 2.0), "a transposed (non-contiguous) x"
        )
        _expect_raises(
            g, lambda: module.clamp_scale(wide[:, ::2], -1.0, 1.0, 2.0), "a strided slice x[:, ::2]"
        )
        _expect_raises(g, lambda: module.clamp_scale(wide, 1.0, -1.0, 2.0), "lo > hi")


def _source_line(e: diagnostics.CompileError) -> str:
    lines = str(e).splitlines()
    return f" | {lines[1].strip()}" if len(lines) > 1 and "|" in lines[1] else ""


EDIT_NAMES = {
    "nothing": "the same call again",
    "touch": "the file touched (new mtime, same content)",
    "comment": "a comment added",
    "flag": "a -D flag added to extra_cflags",
    "header": "the included header edited",
}


@exercise(
    "1.2",
    "Predict which edits rebuild an extension",
    points=4,
    timeout_s=180,
    forbids=("labkernels.ch01_jit.rebuild",),
)
def _grade_1_2(student, g):
    predictions, errors = {}, {}
    for key in scenarios():
        try:
            predictions[key] = student(*key)
        except Exception as e:  # noqa: BLE001  (reported in the case it belongs to)
            errors[key] = e
    # Measured now, with this torch, in this grading process (skipped if no prediction was made at all).
    facts = rebuild_facts(measure_rebuilds()) if predictions else {}

    def judge(keys):
        for key in keys:
            if key in errors:
                raise errors[key]
        wrong = []
        for key in keys:
            said = predictions[key]
            if not isinstance(said, bool):
                raise CaseFailed(f"will_rebuild must return True or False, got {said!r}")
            if said != facts[key]:
                wrong.append(f"{key[0]}, {EDIT_NAMES[key[1]]}, {key[2]} process")
        g.expect(not wrong, "wrong prediction for: " + "; ".join(wrong))

    # The chapter measured these edits in front of you: 2 points. The header, which it did not: 2 points,
    # where only the mechanism (whose hash, which file times) gives the answer. Each case holds edits that
    # rebuild and edits that do not: an answer that says the same for every edit earns nothing from either.
    with g.case("the edits the chapter measured, both APIs, both processes", points=2):
        judge(scenarios(CHAPTER_EDITS))
    with g.case("load: the header its source includes edited, then called again in both processes", points=2):
        judge([k for k in scenarios() if k[1] == "header"])


def relu_sq_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x.double()).square()


@exercise(
    "1.3",
    "An op that opcheck and torch.compile(fullgraph=True) accept",
    points=5,
    timeout_s=300,
    requires="cpp",
)
def _grade_1_3(student, g):
    state = {"op": None}

    def op():
        if state["op"] is None:
            raise CaseFailed("my_ops::relu_sq is not registered (see the first case)")
        return state["op"]

    with g.case("register_relu_sq() registers my_ops::relu_sq", points=1):
        student()  # runs in the worker; the op lives there, and is called there
        try:
            student.opcheck_exists("my_ops::relu_sq")
        except CaseFailed:
            raise CaseFailed("after register_relu_sq() there is no torch.ops.my_ops.relu_sq") from None
        state["op"] = student.op("my_ops::relu_sq")

    with g.case("relu(x)**2 at a weird size, float32 and float64", points=1):
        for dtype in (torch.float32, torch.float64):
            x = g.randn(_odd(g, 1000, 100_000), dtype=dtype, device=CPU)
            out = op()(x)
            g.expect(
                isinstance(out, torch.Tensor) and out.dtype == dtype,
                f"a {dtype} input needs a {dtype} output",
            )
            atol, rtol = TOL[dtype]
            g.check_close(out, relu_sq_reference(x), atol=atol, rtol=rtol)

    with g.case("torch.library.opcheck passes (schema, fake and real kernel agree)", points=2):
        op()  # registered (the first case), or this case fails saying so
        for shape in [(_odd(g, 100, 5000),), (g.randint(2, 30), _odd(g, 10, 200))]:
            x = g.randn(*shape, device=CPU)
            try:
                student.opcheck("my_ops::relu_sq", (x,))
            except Exception as e:  # noqa: BLE001
                first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
                raise CaseFailed(f"opcheck failed: {first[:240]}") from None

    with g.case("runs inside torch.compile(fullgraph=True) with no graph break", points=1):
        op()
        x = g.randn(_odd(g, 100, 5000), device=CPU)
        try:  # in the worker: torch.compile(lambda x: relu_sq(x) * 2 + 1, fullgraph=True)
            out = student.compile_call("my_ops::relu_sq", (x,))
        except Exception as e:  # noqa: BLE001
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise CaseFailed(f"torch.compile(fullgraph=True) failed: {first[:240]}") from None
        g.check_close(out, relu_sq_reference(x) * 2 + 1, atol=1e-5, rtol=1e-5)
