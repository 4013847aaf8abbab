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
