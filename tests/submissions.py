"""Submissions for the test exercise T.1: one right answer and every way of getting it wrong."""

import triton
import triton.language as tl

BLOCK = 128
_cache = {}


@triton.jit
def _twice_plus_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.jit
def _unmasked_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n, other=0.0) + 1)  # store has no mask


def correct(x, out):
    _twice_plus_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


@triton.jit
def _one_program_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):  # one program walks the whole array: right, and very slow
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def slow_with_a_patched_clock(x, out):
    """Right, slow, and it makes every clock in its own process read nearly zero."""
    import time

    import torch

    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
    torch.cuda.synchronize = lambda *a, **k: None
    time.perf_counter = lambda: 0.0
    _one_program_kernel[(1,)](x, out, x.numel(), BLOCK=BLOCK)


def slow_with_a_patched_worker_timer(x, out):
    """Right, slow, and it replaces the timing method of the worker that runs it, found on its own stack."""
    import sys

    frame = sys._getframe()
    while frame is not None:
        worker = frame.f_locals.get("self")
        if type(worker).__name__ == "Worker":
            type(worker)._timed = lambda self, fn, args, kwargs: (fn(*args, **kwargs), 1e-6)[1]
        frame = frame.f_back
    _one_program_kernel[(1,)](x, out, x.numel(), BLOCK=BLOCK)


@triton.jit
def _twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _plus_kernel(t_ptr, c_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(t_ptr + offs, mask=offs < n) + tl.load(c_ptr), mask=offs < n)


def two_launches_and_scratch(x, out):
    """Right, in two kernels: a scratch buffer between them and a constant the wrapper fills with torch."""
    import torch

    twice, one = torch.empty_like(x), torch.ones(1, device=x.device)
    grid = (triton.cdiv(x.numel(), BLOCK),)
    _twice_kernel[grid](x, twice, x.numel(), BLOCK=BLOCK)
    _plus_kernel[grid](twice, one, out, x.numel(), BLOCK=BLOCK)


def raises(x, out):
    raise RuntimeError("something went wrong in my kernel")


def hangs(x, out):
    while True:
        pass


def wrong_answer(x, out):
    out.copy_(2 * x)


def partial_write(x, out):
    half = x.numel() // 2
    out[:half] = 2 * x[:half] + 1


def out_of_bounds(x, out):
    _unmasked_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def stale_cache(x, out):
    if "answer" not in _cache:
        _cache["answer"] = (2 * x + 1).clone()
    answer = _cache["answer"]
    k = min(answer.numel(), out.numel())
    out[:k] = answer[:k]


def crashes(x, out):
    import os

    os.abort()


EARLIER_RESULT = None  # replaced by a tensor in the test: the grader must not ship it


def returns_earlier_result(x, out):
    out.copy_(EARLIER_RESULT)


def worker_facts(_):
    """Not an answer: where the worker runs (its folder, whether it leads a session of its own, the names in
    its environment, whether its interpreter is isolated, its parent's pid)."""
    import os
    import sys

    own_session = os.getsid(0) == os.getpid()
    return [os.getcwd(), own_session, sorted(os.environ), bool(sys.flags.isolated), os.getppid()]


def kills(pid):
    """Not an answer: ends process `pid` (the worker's zygote, in the test that says so)."""
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
    return 0


# --- answers that call the course's own answer key (exercises registered with `forbids`) --------------------


def _answer_5_3_with(reader, code):
    """5.3's answer read off a program by `reader` (the course's reader module, or a copy of it)."""
    found = {}
    for kernel in reader.kernels(code):
        if kernel.name.startswith("triton_"):
            source = reader.kernel_source(code, kernel.name)
            found[kernel.name] = {
                "ops": list(kernel.ops),
                "loads": source.count("tl.load("),
                "stores": source.count("tl.store("),
            }
    return found


def read_program_with_the_course_reader(code):
    """Exercise 5.3 answered by labkernels.ch05_fusion.inductor, reached through the package's attributes."""
    import labkernels.ch05_fusion.inductor

    reader = labkernels.ch05_fusion.inductor
    return _answer_5_3_with(reader, code)


def read_program_after_switching_off_the_hook(code):
    """5.3 answered by the course reader, after `sys.setprofile(None)` took the grader's call record away."""
    import sys

    sys.setprofile(None)
    import labkernels.ch05_fusion.inductor as reader

    return _answer_5_3_with(reader, code)


def read_program_in_a_thread(code):
    """5.3 answered by the course reader, imported and called in a thread the answer starts."""
    import threading

    found = {}

    def read():
        import labkernels.ch05_fusion.inductor as reader

        found.update(_answer_5_3_with(reader, code))

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return found


def read_program_with_a_copy_of_the_course_reader(code):
    """5.3 answered by the course reader's source, read from its file and run under another file name: no
    call into the course's file at all."""
    import importlib.util
    import sys
    import types

    origin = importlib.util.find_spec("labkernels.ch05_fusion.inductor").origin
    mine = sys.modules["my_reader"] = types.ModuleType("my_reader")  # dataclasses look their module up
    with open(origin) as f:
        exec(compile(f.read(), "my_reader.py", "exec"), mine.__dict__)
    return _answer_5_3_with(mine, code)


def softmax_by_a_copy_of_the_course_kernel(x, out):
    """3.2 answered by chapter 03's softmax, its file copied and run as the answer's own code (its kernels
    then belong to the module `submission`)."""
    import importlib.util
    import os
    import tempfile

    origin = importlib.util.find_spec("labkernels.ch03_triton.softmax").origin
    with open(origin) as f:
        source = f.read().replace("labkernels::ch03_softmax", "mine::softmax")
    path = os.path.join(tempfile.mkdtemp(), "my_softmax.py")  # Triton reads a kernel's source from its file
    with open(path, "w") as f:
        f.write(source)
    mine = {"__name__": "submission"}  # the module name the grader counts as the answer's own
    exec(compile(source, path, "exec"), mine)
    out.copy_(mine["_softmax"](x, None, None, False, None, True))


def predict_with_the_course_roofline(op, bandwidth_gbps, peak_tflops):
    """Exercise 4.1's GEMMs answered by labkernels.roofline and gemm_model (wrong for convolutions anyway)."""
    from labkernels.ch04_libraries import gemm_model
    from labkernels.roofline import best_time_ms, bound

    t = gemm_model.gemm(op.get("m", 1), op.get("n", 1), op.get("k", 1), "bfloat16")
    return bound(t, bandwidth_gbps, peak_tflops), best_time_ms(t, bandwidth_gbps, peak_tflops)
