"""A tiny exercise used to prove the grader cannot be fooled: write out = 2·x + 1 into a given output."""

import torch

from labkernels.grading import exercise


@exercise("T.1", "twice plus one (test fixture)", points=3, speed_points=1, timeout_s=60)
def _grade_t1(student, g):
    for name, low, high in [("small", 5, 50), ("weird size", 1000, 3000), ("another weird size", 3001, 9000)]:
        with g.case(name, points=1):
            n = g.randint(low, high) | 1  # odd: never a multiple of a block, so a missing mask always shows
            x = g.randn(n)
            expected = 2 * x + 1
            out = g.guarded_empty((n,), torch.float32)
            student(x, out)
            g.check_close(out, expected, atol=1e-6, rtol=1e-6)
    with g.case("fast enough", points=1, gpu_only=True):
        n = 1 << 24
        x, out = g.randn(n), g.guarded_empty((n,), torch.float32)
        from labkernels import traffic

        g.expect_bandwidth(lambda: student(x, out), traffic.copy(n), fraction=0.05)


@exercise("T.2", "twice plus one as a Triton kernel (test fixture: the replayed clock)", points=1,
          speed_points=1, timeout_s=180, requires="triton")  # fmt: skip
def _grade_t2(student, g):
    def right(x, out):
        g.check_close(out, 2 * x + 1, atol=1e-6, rtol=1e-6)

    with g.case("a weird size", points=1):
        x = g.randn(g.randint(1000, 3000) | 1)
        out = g.guarded_empty(tuple(x.shape), torch.float32)
        student(x, out)
        right(x, out)
    with g.case("at least 10% of copy bandwidth, timed by the grader's replay", points=1, gpu_only=True):
        n = 1 << 24
        x, out = g.randn(n), g.guarded_empty((n,), torch.float32)
        from labkernels import traffic

        g.expect_bandwidth(lambda: student(x, out), traffic.copy(n), fraction=0.1, check=right)
