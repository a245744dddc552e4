"""What every Python check shares: failing with a message, and comparing an answer
with onnxruntime's (equal within 1e-5 relative, 1e-6 absolute for values at or near
zero). Imported by the check scripts beside it."""
import sys

import numpy as np

RTOL = 1e-5
# Only for reference values that are exactly or nearly zero: a sum that comes out near
# zero carries the rounding of terms far larger, and the compiled CPU engine adds them in
# another order than onnxruntime (2.4e-7 seen on tick_002's 200 rows).
ATOL = 1e-6


def check(cond, what):
    """Exits with FAIL and `what` unless `cond` holds."""
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def compare(got, want, what, same_dtype=True):
    """Checks `got` against `want`: shape, dtype (unless `same_dtype` is off, for
    answers that pass through JSON numbers), and values within RTOL / ATOL."""
    got, want = np.asarray(got), np.asarray(want)
    check(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    if same_dtype:
        check(got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}")
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = RTOL * np.abs(want.astype(np.float64)) + ATOL
    worst = float(np.max(err / bound)) if err.size else 0.0
    check(np.all(err <= bound), f"{what}: max error {err.max() if err.size else 0} over bound "
                                f"(worst ratio {worst:.2f})")
