"""How the GPU machine's run (`gpu_jobs/test_gpu.sh`: pytest-xdist with `--dist loadgroup`) spreads tests.

The kernel files' tests go to whichever worker is free, one by one: most of their time is compiling each
autotuning config of a new shape, and one file on one worker outlasted the run. Every other file stays whole
on one worker, as `--dist loadfile` had it (builds of C++ extensions and their locks, files on disk). The
tests past 2^31 elements (10-20 GB each) stay on one worker per file, so no more of them run at once than
before. Without xdist (the CPU lane, `make test`) the groups do nothing."""

import pytest

SPREAD_FILES = {
    "test_ch03_triton.py",
    "test_ch03_hardening.py",
    "test_ch04_kernels.py",
    "test_ch05_fusion.py",
    "test_ch06_attention.py",
}
PAST_2_31 = {"test_kernel_above_2_to_31_elements", "test_matmul_beyond_int32_offsets"}


def pytest_collection_modifyitems(items):
    for item in items:
        file = item.path.name
        if file not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group(file))
        elif item.originalname in PAST_2_31:
            item.add_marker(pytest.mark.xdist_group(f"{file}, past 2^31"))
