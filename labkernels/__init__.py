"""labkernels: the machinery and the kernels of the course.

Import this package before triton: it picks the lane (GPU, or CPU under the Triton interpreter) first.
"""

from labkernels.lane import DEVICE, LANE, lane, on_gpu, require_device, size  # noqa: I001  (must run first)

import triton  # noqa: E402,F401  (imported after the lane is set)

__all__ = ["DEVICE", "LANE", "lane", "on_gpu", "require_device", "size"]
__version__ = "0.1.0"
