"""Noise primitives shared by mechanisms: clipping and Gaussian noise, in float64 or snapped to a power-of-two grid with discrete-Gaussian noise (hardened against
floating-point attacks).

All functions are pure JAX and run inside ``jit``/``scan``.  They are the pieces whose
correctness the guarantee rests on, so they are small and tested on their own, statistically.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

# Imported for its setting: 64-bit JAX before any noise is drawn (``import dpppl`` is lazy and no
# longer sets it).
import dpppl.model.jax_compile  # noqa: F401
from dpppl.errors import InexactReleaseError, InvalidPrivacyParameterError
from dpppl.privacy.budget import total_variation_delta


def clip_rows(rows: jax.Array, bound: float | jax.Array) -> jax.Array:
    """Scale every row to L2 norm at most ``bound`` (one for all rows, or one per row, shape
    (B, 1)); rows that are not finite become zero.

    A record whose gradient is NaN or infinite (for example a value outside the model's support)
    contributes nothing rather than poisoning the sum: the rule does not depend on other records,
    so the sensitivity stays ``bound``.
    """
    finite = jnp.all(jnp.isfinite(rows), axis=-1, keepdims=True)
    rows = jnp.where(finite, rows, 0.0)
    norms = jnp.sqrt(jnp.sum(rows**2, axis=-1, keepdims=True))
    return rows * jnp.minimum(1.0, bound / jnp.maximum(norms, jnp.finfo(rows.dtype).tiny))


def gaussian_noise(key: jax.Array, shape: tuple[int, ...], std: float | jax.Array) -> jax.Array:
    """N(0, std²) noise of the given shape."""
    return std * jax.random.normal(key, shape, dtype=jnp.float64)


def jax_key(seed: np.random.SeedSequence) -> jax.Array:
    """A JAX PRNG key whose 128 bits of key data come from the seed sequence.

    Every noise draw of a fit is a deterministic function of this key, and a guessed key can be
    checked against a released trace, so its size bounds the work of such a search.  JAX's default
    threefry2x32 key holds 64 bits; the ``rbg`` implementation holds 128 (streams then depend on
    the platform: a seeded fit reproduces on the same kind of device).
    """
    return jax.random.wrap_key_data(
        jnp.asarray(seed.generate_state(4, dtype=np.uint32)), impl="rbg"
    )


# -- noise hardened against floating-point attacks ------------------------------------------------
#
# A float64 output ``x + noise`` can only take the floating-point numbers near x, so its low bits
# can tell neighbouring data sets apart whatever ε says (Mironov 2012 for Laplace noise; Jin et
# al. 2022, arXiv 2107.10138, and Haney et al. 2022, arXiv 2112.05307, for Gaussian noise).  The
# snapped release rounds every clipped row to a power-of-two grid, sums them exactly and adds an
# integer number of grid steps drawn from the discrete Gaussian, so every output is exactly
# k · grid and which k are possible does not depend on the data.  :class:`SnappedGaussian`
# chooses the grid and states what the release costs in privacy.

#: |:func:`discrete_gaussian`| < NOISE_BOUND · scale for every draw (the proposal is below 45 t).
NOISE_BOUND = 64
#: :meth:`SnappedGaussian.for_sum` keeps every release below this many grid steps ...
SNAP_RANGE = 2.0**50
#: ... and :func:`snapped_gaussian_release` checks at run time that it stays below 2⁵³ steps, up
#: to which float64 holds every integer exactly.
EXACT_RANGE = 2.0**53
#: The smallest noise scale (std / grid) of a snapped release: from there on the discrete Gaussian
#: is within 5·10⁻¹⁸ of the rounded continuous Gaussian in total variation.
MIN_SCALE = 2.0**26
#: Bound on the total variation between one draw of :func:`discrete_gaussian` and a law within a
#: factor e^(±``SAMPLER_LOG_RATIO``) of the exact discrete Gaussian: what the proposal's
#: thresholds, the acceptance test's 63-bit comparison and its underflow leave (derivation there).
SAMPLER_TV = 2.0**-56
#: Bound on the log-ratio of that law to the exact discrete Gaussian at every integer: the float64
#: rounding of the acceptance probability, a relative error, wherever it is above 2⁻⁶⁴.
SAMPLER_LOG_RATIO = 2.0**-43
#: Largest scale :func:`discrete_gaussian` takes: its proposals (below 45 t ≤ 45·√2·scale) stay
#: below 2⁵³, exact in float64.
MAX_SCALE = 2.0**46
#: Lower bound on the probability that one proposal of :func:`discrete_gaussian` is accepted.
MIN_ACCEPTANCE = 0.412


def _exp_thresholds(count: int) -> np.ndarray:
    """⌊e^(−v) · 2⁶⁴⌋ for v = 1..``count``, exactly (60-digit decimal arithmetic)."""
    with decimal.localcontext() as context:
        context.prec = 60
        return np.array(
            [
                int((decimal.Decimal(-v).exp() * 2**64).to_integral_value(decimal.ROUND_FLOOR))
                for v in range(1, count + 1)
            ],
            dtype=np.uint64,
        )


#: P(V ≥ v) = _V_THRESHOLDS[v − 1] / 2⁶⁴ for the Geometric(1 − e⁻¹) part V of a proposal; v = 44
#: is the last with a nonzero threshold (e⁻⁴⁵ · 2⁶⁴ < 1).
_V_THRESHOLDS = _exp_thresholds(44)


def discrete_gaussian(
    key: jax.Array, shape: tuple[int, ...], scale: float | jax.Array
) -> jax.Array:
    """Integers drawn from the discrete Gaussian N_Z(0, s²), s = ``scale``: P(k) ∝ e^(−k²/(2s²)).

    The rejection sampler of Canonne, Kamath and Steinke (2020, "The discrete Gaussian for
    differential privacy", NeurIPS; Algorithms 2 and 3) with every random choice except one made
    from integer random bits.  With t = 2^round(log₂ s) (so s/t ∈ [2^−½, 2^½]), a proposal is

    * U uniform on {0, …, t − 1}: the top log₂ t bits of a 64-bit word, whose lowest bit is the
      sign b;
    * V with P(V ≥ v) = ⌊e^(−v) 2⁶⁴⌋ / 2⁶⁴ for v = 1..44, 0 after: a 64-bit word compared with
      exact integer thresholds (the Geometric(1 − e⁻¹) law up to 2⁻⁶⁴ per threshold);
    * Y = ±(U + tV) (sign b; −0 is rejected), accepted with probability
      a(Y) = exp(−U/t − (|Y|/s − s/t)² / 2) by comparing a 63-bit word with ⌊a · 2⁶³⌋.

    The accepted Y has P(y) ∝ e^(−|y|/t) · e^(−(|y| − s²/t)²/(2s²)) ∝ e^(−y²/(2s²)): CKS20's
    discrete-Laplace proposal (their Algorithm 2 draws U, its acceptance e^(−U/t) and V; both
    acceptance tests are merged into one here).  A proposal is accepted with probability
    A = (1 − e⁻¹)(√(2π)/2)(s/t) e^(−s²/(2t²)) (1 + θ) ≥ 0.412 (``MIN_ACCEPTANCE``), with θ ≥ 0
    from Poisson summation.

    The accepted proposals of an i.i.d. sequence are i.i.d. draws from the target, so one round
    draws a pool of about (n + 4√n + 8)/0.412 proposals for n outputs and hands the accepted
    ones to the outputs in order; outputs left over (rarely) are filled by further rounds in a
    ``jax.lax.while_loop``.  Every draw satisfies |Y| < 45 t < 64 s (``NOISE_BOUND``).

    **What float64 leaves.**  The output is an exact integer and its support, every |y| < 45 t
    whose acceptance probability is not lost to underflow, depends on s alone.  Only the
    acceptance probability is computed in floating point; its error, not the data, can shift
    probabilities.  With u = 2⁻⁵³ and w = |y|/s − s/t (IEEE arithmetic), the computed log a is
    within u (2.5 w² + √2 |w| + |log a|)(1 + 10⁻⁹) of the exact one, and exp adds a relative
    error of at most 8 u (4 ulp; XLA's CPU exp is within 1.6 ulp, checked in
    ``tests/privacy/test_randomness.py``).  Split the proposals y by their exact a:

    * where a ≥ 2⁻⁶⁴, |log a| ≤ 44.37 and w² ≤ 2 |log a|, so the computed ã is within a relative
      ρ = 288 u of a (279.5 u from log a, 8 u from exp);
    * elsewhere |w| < 64 keeps the error of log a below 2·10⁻¹² and ã < 2⁻⁶³, so the test never
      accepts y, whose exact acceptance is below 2⁻⁶⁴.

    Let f = π a be the exact one-round sub-probabilities (π the exact proposal law), f̃ the
    computed ones, and f′ = π ã where a ≥ 2⁻⁶⁴, f′ = f elsewhere.  Then f′/f lies in
    [1 − ρ, 1 + ρ] everywhere, so the output law f′/‖f′‖₁ of a rejection sampler with f′ is
    within a factor (1 + ρ)/(1 − ρ) < e^(``SAMPLER_LOG_RATIO``) = e^(2⁻⁴³) of N_Z at every
    integer, either way.  And ‖f̃ − f′‖₁ is at most the 2⁻⁶³ of the comparison with a 63-bit
    word, plus 2⁻⁶⁴ for the proposals never accepted, plus V's thresholds'
    2(44 · 2⁻⁶⁴ + Σ_{v≥45} e^(−v)) < 5·10⁻¹⁸ in the proposal law, so the real output is within
    total variation ‖f̃ − f′‖₁ / Ã < 5.17·10⁻¹⁸ / 0.41199 < ``SAMPLER_TV`` = 2⁻⁵⁶ of that law.
    A relative error is a max-divergence, which the privacy accounting adds to ε, not a total
    variation, which it charges (1 + e^ε)-fold in δ (:class:`SnappedGaussian`).
    (``jax.random.geometric`` would not do for the proposal: it takes a float log of a 52-bit
    uniform, whose law at t ≈ 2⁴⁰ is off by a relative 2⁻¹² per integer and has holes beyond
    about 8 t.)

    Parameters
    ----------
    key
        A JAX PRNG key (threefry: its bits are taken as uniform and independent).
    shape
        Shape of the draw.
    scale
        s, in grid units, in [1, ``MAX_SCALE``]; checked when it is a concrete number, clamped
        to that range when it is traced (the caller checks it).

    Returns
    -------
    jax.Array
        int64 draws of the given shape.
    """
    if not isinstance(scale, jax.core.Tracer):
        scale = float(scale)
        if not (math.isfinite(scale) and 1 <= scale <= MAX_SCALE):
            raise ValueError(f"scale must be a finite number in [1, 2**46], got {scale!r}")
    # A traced scale cannot be refused here: clamping it (NaN to 1) keeps the loop finite, and
    # snapped_gaussian_release reports a draw at a scale out of range as not exact.
    scale = jnp.clip(jnp.nan_to_num(jnp.asarray(scale, dtype=jnp.float64), nan=1.0), 1, MAX_SCALE)
    log2_t = jnp.round(jnp.log2(scale)).astype(jnp.uint64)
    t = jnp.ldexp(1.0, log2_t.astype(jnp.int32))
    ascending = jnp.asarray(_V_THRESHOLDS[::-1])

    count = math.prod(shape)
    # Enough proposals that a second round is rarely needed: n accepted ones are expected with
    # about 4√n + 8 to spare.
    pool = math.ceil((count + 4 * math.sqrt(count) + 8) / MIN_ACCEPTANCE)

    def propose(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        words = jax.random.bits(key, (3, pool), dtype=jnp.uint64)
        u = (words[0] >> 1) >> (63 - log2_t)
        negative = (words[0] & 1) == 1
        # V = #{v : word < ⌊e^(−v) 2⁶⁴⌋}, by binary search in the ascending thresholds.
        v = (len(_V_THRESHOLDS) - jnp.searchsorted(ascending, words[1], side="right")).astype(
            jnp.uint64
        )
        magnitude = u + (v << log2_t)
        threshold = (acceptance(magnitude, u, scale, t) * 2.0**63).astype(jnp.uint64)
        accepted = ((words[2] >> 1) < threshold) & ~(negative & (magnitude == 0))
        value = magnitude.astype(jnp.int64)
        return jnp.where(negative, -value, value), accepted

    outputs = jnp.arange(count)

    def fill(state):
        out, filled, key = state
        key, sub = jax.random.split(key)
        values, accepted = propose(sub)
        # Output i ≥ filled takes the (i − filled + 1)-th accepted proposal of this round.
        accepted_so_far = jnp.cumsum(accepted)
        index = jnp.searchsorted(accepted_so_far, outputs - filled + 1)
        new = (outputs >= filled) & (index < pool)
        out = jnp.where(new, values[jnp.minimum(index, pool - 1)], out)
        return out, jnp.minimum(filled + accepted_so_far[-1], count), key

    start = fill((jnp.zeros(count, dtype=jnp.int64), jnp.array(0), key))
    return jax.lax.while_loop(lambda state: state[1] < count, fill, start)[0].reshape(shape)


def acceptance(
    magnitude: jax.Array, low: jax.Array, scale: float | jax.Array, t: float | jax.Array
) -> jax.Array:
    """The acceptance probability a = exp(−U/t − (|y|/s − s/t)²/2) of :func:`discrete_gaussian`'s
    proposal |y| = ``magnitude`` with U = ``low`` (|y| mod t), computed in float64 as the
    sampler computes it: within a relative 288·2⁻⁵³ of the exact value wherever that is at least
    2⁻⁶⁴, and below 2⁻⁶³ elsewhere (derivation in :func:`discrete_gaussian`)."""
    w = magnitude.astype(jnp.float64) / scale - scale / t
    return jnp.exp(-(low.astype(jnp.float64) / t) - 0.5 * w * w)


def discrete_gaussian_tv_bound(scale: float) -> float:
    """η(s): an upper bound on TV(N_Z(0, s²), round(N(0, s²))) for s = ``scale`` ≥ 1.

    round(N(0, s²)) is the continuous Gaussian rounded to the nearest integer.  The bound is

        η(s) = (4 e^(−½) + (2 + 8 e^(−3/2)) / s) / (48 √(2π) s²) + q / (1 − q),  q = e^(−2π²s²),

    about 0.0202/s² + 0.0315/s³ (the first term is asymptotically exact).

    Proof.  Let φ(x) = e^(−x²/(2s²)) and c = ∫φ = s√(2π).  The discrete Gaussian has masses
    φ(k)/Z with Z = Σ_k φ(k) = c Σ_n e^(−2π²s²n²) = c(1 + θ) (Poisson summation), and
    0 ≤ θ = 2 Σ_{n≥1} e^(−2π²s²n²) ≤ 2q/(1 − q).  The rounded Gaussian has masses Φ_k / c with
    Φ_k = ∫_{k−½}^{k+½} φ.  Then Σ_k |φ(k)/Z − Φ_k/c| ≤ Σ_k |φ(k) − Φ_k|/c + θ/(1 + θ) · Σ_k φ(k)/c
    = Σ_k |e_k|/c + θ with e_k = Φ_k − φ(k).  By Taylor's theorem with the linear term
    integrating to zero (the midpoint rule), |e_k| ≤ (1/24) max_{I_k} |φ''| on
    I_k = [k − ½, k + ½].  On an interval of length 1, max |g| ≤ ∫|g| + (variation of g), so
    Σ_k max_{I_k} |φ''| ≤ ∫|φ''| + ∫|φ'''|.  With x = sz, φ''(x) = (z² − 1) e^(−z²/2)/s² and
    φ'''(x) = (3z − z³) e^(−z²/2)/s³, whose antiderivatives −z e^(−z²/2) and
    (z² − 1) e^(−z²/2) give ∫|φ''| = 4 e^(−½)/s and ∫|φ'''| = (2 + 8 e^(−3/2))/s².  Halving
    the L1 distance gives η(s).  ∎

    ``tests/privacy/test_randomness.py`` checks it against the exact distance (mpmath) at
    s = 1, 2, 5 and 10.
    """
    scale = float(scale)
    if not (math.isfinite(scale) and scale >= 1):
        raise ValueError(f"scale must be a finite number >= 1, got {scale!r}")
    q = math.exp(-2 * math.pi**2 * scale**2)
    smooth = (4 * math.exp(-0.5) + (2 + 8 * math.exp(-1.5)) / scale) / (
        48 * math.sqrt(2 * math.pi) * scale**2
    )
    return smooth + q / (1 - q)


def snapped_sensitivity(
    clipping_bound: float | jax.Array, grid: float | jax.Array, dim: int
) -> float | jax.Array:
    """C + grid·√d: the L2 sensitivity of a sum of rows of norm ≤ C each rounded to the grid."""
    return clipping_bound + grid * math.sqrt(dim)


@dataclass(frozen=True)
class SnappedGaussian:
    """The public parameters of a snapped Gaussian release and what it costs in privacy.

    The release (:func:`snapped_gaussian_release`) of a batch of rows x_i with ‖x_i‖ ≤ C in
    d dimensions is R = g (Σ_i round(x_i / g) + X), X ~ N_Z(0, s²)^d drawn by
    :func:`discrete_gaussian`, at grid g (a power of two), std σΔ with Δ = C + g√d
    (:attr:`sensitivity`) and scale s = σΔ/g ≥ ``MIN_SCALE``.

    **Theorem.**  Let a mechanism make T adaptive steps, each releasing R for a (for example
    Poisson-subsampled) batch of clipped rows, and suppose that the same mechanism with X
    replaced by round(s Z), Z ~ N(0, I_d), is (ε_a, δ_a)-DP by an accountant's bound for the
    Gaussian mechanism with noise multiplier σ and sensitivity Δ.  With γ = T d
    ``SAMPLER_LOG_RATIO`` (:meth:`max_divergence`) and τ = T d (η(s) + ``SAMPLER_TV``), η from
    :func:`discrete_gaussian_tv_bound`, it is (ε, e^γ δ_a + (1 + e^ε) τ)-DP with
    ε = ε_a + 2γ; :meth:`delta_cost` bounds (1 + e^ε) τ.

    *Proof.*  (1) With m = Σ_i round(x_i/g) an integer vector, m + round(s Z) =
    round((g m + σΔ Z)/g): the idealised release P₀ is a rounding, i.e. post-processing, of the
    Gaussian mechanism applied to g m, whose L2 sensitivity to adding or removing one row is
    ‖g round(x/g)‖ ≤ C + g√d/2 ≤ Δ.  So the event with multiplier σ (relative to Δ) and the
    accountant apply unchanged.  (The spare g√d/2 also covers the float64 rounding of
    clipping, relative error below (d/2 + 3) 2⁻⁵³, whenever the grid of :meth:`for_sum` is
    used and capacity + 64σ ≥ √d / 8.)  The noise is drawn independently of the data and of
    earlier outputs, so a bound on each of the T d draws bounds the whole output's law, for every
    data set, as follows.  (2) P₁, with exact N_Z(0, s²) noise, is within total variation
    T d η(s) of P₀.  (3) P₂, with noise whose law is within a factor e^(±SAMPLER_LOG_RATIO) of
    N_Z(0, s²) at every integer (:func:`discrete_gaussian`), has P₂(S | D) within a factor
    e^(±γ) of P₁(S | D) for every set S of outputs.  (4) The real release P̃ is within total
    variation T d SAMPLER_TV of P₂.  Then, with E = e^(ε_a): P₁ is
    (ε_a, δ_a + (1 + E) T d η)-DP (a distance τ′ gives P₁(S | D) ≤ P₀(S | D) + τ′
    ≤ E P₀(S | D′) + δ_a + τ′ ≤ E P₁(S | D′) + δ_a + (1 + E) τ′); P₂ is
    (ε, e^γ δ_a + e^γ (1 + E) T d η)-DP, and e^γ (1 + E) ≤ 1 + E e^(2γ) = 1 + e^ε because
    (e^γ − 1)(E e^γ − 1) ≥ 0; and P̃ adds (1 + e^ε) T d SAMPLER_TV in the same way.  ∎

    Float64 exactness: the rows are rounded *before* summing, so the sum of integers is exact
    in any order while Σ|round(x_i/g)| + |X| < 2⁵³, which :func:`snapped_gaussian_release`
    checks; :meth:`for_sum` makes it at most 2⁵⁰ + capacity/2 by construction, so the check
    never fails, and raising is not an output that depends on the data.

    CKS20 (Theorem 14 and Proposition 5) also give concentrated/Rényi DP for the discrete
    Gaussian directly, but nothing proves that the continuous Gaussian's subsampled accountants
    cover its Poisson-subsampled version (amplification bounds use more than the base
    mechanism's Rényi divergences), hence the coupling; dp-accounting's discrete-Gaussian PLD is
    one-dimensional with an integer sensitivity, not an L2 bound in d dimensions.

    Attributes
    ----------
    grid
        g, a power of two.
    clipping_bound
        C, the bound on each row's L2 norm.
    noise_multiplier
        σ, relative to :attr:`sensitivity`.
    dim
        d, the number of coordinates.
    """

    grid: float
    clipping_bound: float
    noise_multiplier: float
    dim: int

    def __post_init__(self) -> None:
        mantissa, exponent = math.frexp(self.grid)
        if not (mantissa == 0.5 and -960 <= exponent <= 960):
            raise ValueError(f"grid must be a power of two in [2**-960, 2**960], got {self.grid!r}")
        if not MIN_SCALE <= self.scale <= MAX_SCALE:
            raise InvalidPrivacyParameterError(
                f"a snapped release at noise multiplier {self.noise_multiplier:.4g} on grid "
                f"2**{exponent - 1} has a noise scale of {self.scale:.4g} grid steps, outside "
                "[2**26, 2**46]; SnappedGaussian.for_sum chooses the grid, and a scale below "
                "2**26 there means the noise is too small for the range of the sum (add noise "
                "or use a float release)"
            )

    @classmethod
    def for_sum(
        cls, *, capacity: int, clipping_bound: float, noise_multiplier: float, dim: int
    ) -> SnappedGaussian:
        """The finest power-of-two grid on which a sum of up to ``capacity`` rows plus noise
        stays below 2⁵⁰ grid steps: the smallest g with capacity·C + 64σ(C + g√d) < 2⁵⁰ g.

        The grid depends on public quantities only; a finer one would lower the sensitivity
        C + g√d further but could leave float64's exact range.
        """
        def fits(grid: float) -> bool:
            spread = NOISE_BOUND * noise_multiplier * snapped_sensitivity(clipping_bound, grid, dim)
            return capacity * clipping_bound + spread < SNAP_RANGE * grid

        slope = SNAP_RANGE - NOISE_BOUND * noise_multiplier * math.sqrt(dim)
        if slope <= 0:
            raise InvalidPrivacyParameterError(
                f"noise multiplier {noise_multiplier:.4g} is too large for a snapped release in "
                f"{dim} dimensions"
            )
        least = (capacity + NOISE_BOUND * noise_multiplier) * clipping_bound / slope
        # One power below the rounded-down estimate, in case log2 rounded up; the condition is
        # monotone in the grid, so the first power of two that fits is the finest.
        grid = 2.0 ** (math.floor(math.log2(least)) - 1)
        while not fits(grid):
            grid *= 2
        return cls(grid, float(clipping_bound), float(noise_multiplier), int(dim))

    @property
    def sensitivity(self) -> float:
        """Δ = C + g√d, the L2 sensitivity the noise multiplier is relative to."""
        return snapped_sensitivity(self.clipping_bound, self.grid, self.dim)

    @property
    def std(self) -> float:
        """σΔ, the standard deviation of the noise (before discretisation)."""
        return self.noise_multiplier * self.sensitivity

    @property
    def scale(self) -> float:
        """s = σΔ/g, the noise in grid steps."""
        return self.std / self.grid

    @staticmethod
    def delta_cost(*, steps: int, dim: int, epsilon: float) -> float:
        """Extra δ of ``steps`` releases of ``dim`` coordinates at privacy level ε, for every
        snapped release (their scale is at least ``MIN_SCALE``):
        (1 + e^ε) · steps · dim · (η(MIN_SCALE) + SAMPLER_TV)."""
        per_draw = discrete_gaussian_tv_bound(MIN_SCALE) + SAMPLER_TV
        return total_variation_delta(epsilon, steps * dim * per_draw)

    @staticmethod
    def max_divergence(*, steps: int, dim: int) -> float:
        """γ = steps · dim · SAMPLER_LOG_RATIO: the released noise's law is within a factor
        e^(±γ) of exact discrete-Gaussian noise, which adds 2γ to ε and scales the accounted δ
        by e^γ (see the class's theorem)."""
        return steps * dim * SAMPLER_LOG_RATIO


def snapped_gaussian_release(
    key: jax.Array,
    rows: jax.Array,
    std: float | jax.Array,
    grid: float | jax.Array,
    counts: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Σ ``rows`` plus noise of std ``std``, released exactly on the grid {k · ``grid``}.

    Each row is rounded to the nearest multiple of ``grid`` (a power of two), the rounded rows
    are summed, and ``grid`` times an integer from N_Z(0, (std/grid)²) (:func:`discrete_gaussian`)
    is added, so every output is exactly k · grid: its low bits carry nothing finer than the
    grid.  Rounding before summing makes the sum exact in any order and bounds a row's effect
    by C + grid·√d/2; :class:`SnappedGaussian` chooses the grid and states the guarantee.  Pass
    its ``std`` (σ(C + grid√d)), not σC.

    Inside ``jit``/``scan`` nothing can be raised, so the second output says whether the release
    is exact: the noise scale std/grid is in [1, ``MAX_SCALE``] and every partial sum, and the
    output, is a finite integer below 2⁵³ in magnitude.  Check it with :func:`require_exact`
    before anything is released.

    Parameters
    ----------
    key
        A JAX PRNG key.
    rows
        The clipped rows, shape (n, d) float64 (unused slots zero).
    std
        The noise standard deviation σ(C + grid√d).
    grid
        The output grid, a power of two (checked when it is a concrete number).
    counts
        How many records each row stands for, shape (n,) (None: one each).  A row is rounded
        once and then counted, so the release is the one its records, rounded one by one,
        would give (see :func:`~dpppl.privacy.subsampling.copies_of`).

    Returns
    -------
    tuple of jax.Array
        The released (d,) float64 values, each an integer multiple of ``grid``, and a boolean
        scalar: whether they are exact.
    """
    if not isinstance(grid, jax.core.Tracer):
        grid = float(grid)
        if not (grid > 0 and math.frexp(grid)[0] == 0.5):
            raise ValueError(f"grid must be a positive power of two, got {grid!r}")
    steps = jnp.round(jnp.asarray(rows, dtype=jnp.float64) / grid)
    if counts is not None:
        steps = steps * counts[:, None]
    scale = std / grid
    noise = discrete_gaussian(key, steps.shape[1:], scale).astype(jnp.float64)
    # Σ|k_i| + |X| bounds every partial sum, and its computed value reaches 2⁵³ exactly when its
    # exact value does (rounding is monotone); NaN and infinity fail the comparisons too.
    bound = jnp.sum(jnp.abs(steps), axis=0) + jnp.abs(noise)
    exact = jnp.all(bound < EXACT_RANGE) & (scale >= 1) & (scale <= MAX_SCALE)
    return (jnp.sum(steps, axis=0) + noise) * grid, exact


def require_exact(exact: bool | jax.Array) -> None:
    """Raise :class:`~dpppl.errors.InexactReleaseError` unless every snapped release was exact.

    Call it on the flags of :func:`snapped_gaussian_release` after the loop, before anything is
    returned; the message names no value.
    """
    if not bool(exact):
        raise InexactReleaseError(
            "a snapped noisy release left the range in which float64 holds its grid exactly "
            "(2**53 grid steps) or was not finite, so it is withheld; the grid is too fine for "
            "the bound on the released sums"
        )
