"""exp(x) and log(x) in plain arithmetic, so that a loop of them compiles to vector instructions.

libm's ``exp`` is an opaque call: a loop of K² of them (one label's softmax rows, eq. 3)
runs one at a time. ``exp`` below is Cody and Waite's reduction, x = k ln 2 + r with k an
integer and |r| <= ln 2 / 2, then exp(r) by its Taylor series to r^13 (the remainder is
below 1e-17 relative) and 2^k put straight into the exponent bits: no branch and no call,
so a loop of it is vectorised (4 or 8 lanes), about 2 ns an exp against libm's 4.3.
Within 1 ulp of libm's exp (the same bits in 88% of the cases) for every x in [-708, 709].
Each lane does the same IEEE operations in the same order (no fused multiply-add: numba
compiles without fast-math), so a result does not depend on the vector width or on whether
the loop was vectorised: replays stay bit-identical.

Below -708 the result is 0 (libm's is at most 3.3e-308, lost in any sum with the row's
largest term, 1); NaN gives NaN; above 709 it gives inf (libm's is finite up to 709.78: the
callers here pass shifted logits, at most 0).

``log`` likewise: x = 2^k m with m in [sqrt(1/2), sqrt(2)), read from the bits, then
log m = 2 atanh(s) with s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^23 (the
remainder is below 1e-17 relative), plus k ln 2; within 2 ulp of libm's for every positive
double (subnormals scaled by 2^54 first); 0 gives -inf, a negative number or NaN gives NaN,
inf gives inf.

``normalise`` is a softmax in place with libm's exp (a row of K values: a call each costs
less than a vector loop), shared by the nominal and the calibration kernels.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from core._numba import jit_inline

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2's leading bits: k * _LN2_HI is exact for |k| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2^52: adding it rounds a double of |v| < 2^51 to an integer
_LOWEST = -708.0
_EXP_SERIES = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))
_ATANH_SERIES = tuple(1.0 / n for n in range(23, 1, -2))
_HIGHEST = 709.0


@intrinsic
def _as_bits(typingctx, x):
    """The int64 whose bits are the IEEE bits of the double ``x`` (a bit cast)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _as_double(typingctx, bits):
    """The double whose IEEE bits are the int64 ``bits`` (a bit cast, no conversion)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@jit_inline
def exp(x):
    """e^x, within 1 ulp of libm's for x in [-708, 709] (module docstring)."""
    v = min(max(x, _LOWEST), _HIGHEST)
    k = (v * _LOG2E + _ROUND) - _ROUND
    r = (v - k * _LN2_HI) - k * _LN2_LO
    p = 0.0
    for c in _EXP_SERIES:  # Horner, from r^13 / 13! down to 1
        p = p * r + c
    y = p * _as_double((int(k) + 1023) << 52)  # type: ignore[call-arg]
    y = 0.0 if x < _LOWEST else y
    y = np.inf if x > _HIGHEST else y
    return x if x != x else y  # NaN stays NaN


_SQRT2 = 1.4142135623730951
_SMALLEST_NORMAL = 2.2250738585072014e-308
_MANTISSA = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000


@jit_inline
def log(x):
    """ln x, within 2 ulp of libm's for every positive double (module docstring)."""
    tiny = x < _SMALLEST_NORMAL
    v = x * 18014398509481984.0 if tiny else x  # 2^54: a subnormal becomes normal, exactly
    bits = _as_bits(v)  # type: ignore[call-arg,var-annotated]
    k = (bits >> 52) - (1023 + 54 if tiny else 1023)
    m = _as_double((bits & _MANTISSA) | _ONE_BITS)  # in [1, 2)
    big = m > _SQRT2
    m = m * 0.5 if big else m
    k = k + 1 if big else k
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    t = 0.0
    for c in _ATANH_SERIES:  # Horner, from z^10 / 23 down to 1 / 3
        t = t * z + c
    kf = float(k)
    y = (kf * _LN2_HI + 2.0 * s) + (kf * _LN2_LO + 2.0 * s * z * t)
    y = -np.inf if x == 0.0 else y
    y = np.inf if x == np.inf else y
    return np.nan if (x < 0.0 or x != x) else y


@jit_inline
def padded(n):
    """``n`` rounded up to whole vectors of 8 doubles: the length of the scratch that
    ``exp_all`` runs over (its zeros past ``n`` cost nothing and leave no scalar tail)."""
    return -(-n // 8) * 8


@jit_inline
def exp_all(x, e, n):
    """e[:n] = exp(x[:n]) elementwise (n a ``padded`` length): one vectorised loop."""
    for i in range(n):
        e[i] = exp(x[i])


@jit_inline
def log_all(x, out, n):
    """out[:n] = log(x[:n]) elementwise (n a ``padded`` length): one vectorised loop."""
    for i in range(n):
        out[i] = log(x[i])


@jit_inline
def normalise(logq, q):
    """q = softmax(logq); returns log sum exp(logq), the item's log marginal likelihood. One
    exp per class (q = exp(logq - max), then divided by its sum; libm's: for K values alone a
    call each costs less than ``exp_all``'s vector loop)."""
    m = -np.inf
    for v in logq:
        m = max(m, v)
    if m == -np.inf:  # no class possible: q is undefined
        q[:] = np.nan
        return m
    acc = 0.0
    for z in range(q.shape[0]):
        q[z] = math.exp(logq[z] - m)
        acc += q[z]
    for z in range(q.shape[0]):
        q[z] /= acc
    return m + math.log(acc)
