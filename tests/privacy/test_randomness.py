"""Where the noise comes from: OS entropy unless a seed is given, a seed only reproduces and is never
stored, and the release hardened against floating-point attacks (NA-DPVI's default)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
import xarray as xr
from scipy import stats

import dpppl
from dpppl.errors import InexactReleaseError, InvalidPrivacyParameterError
from dpppl.privacy.noise import (
    MIN_SCALE,
    NOISE_BOUND,
    SnappedGaussian,
    acceptance,
    discrete_gaussian,
    discrete_gaussian_tv_bound,
    jax_key,
    require_exact,
    snapped_gaussian_release,
)

SIGNIFICANCE = 1e-6
TINY = {"mechanism": "na-dpvi", "epsilon": 1.0, "delta": 1e-3, "progressbar": False,
        "steps": 40, "burn_in": 0.0, "posterior": "naive", "draws": 20, "chains": 1,
        "mc_draws": 2}
SEED = 918_273_645


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    with pm.Model(coords={"obs": range(30)}) as m:
        mu = pm.Normal("mu", 0, 3)
        pm.Normal("y", mu, 1, observed=rng.normal(1, 1, 30), dims="obs")
    return m


def fit(model, **kwargs):
    with model:
        return dpppl.sample(**{**TINY, **kwargs})


def released(result) -> np.ndarray:
    return result["dpvi_trace"]["noisy_sum"].values


class TestSeeds:
    def test_two_unseeded_fits_draw_different_noise(self, model):
        first, second = fit(model), fit(model)
        assert not np.array_equal(released(first), released(second))
        assert first.attrs["dp_seeded"] == 0 and second.attrs["dp_seeded"] == 0

    def test_a_seed_reproduces_the_release_exactly(self, model):
        first, second = fit(model, random_seed=SEED), fit(model, random_seed=SEED)
        np.testing.assert_array_equal(released(first), released(second))
        np.testing.assert_array_equal(first.posterior["mu"].values, second.posterior["mu"].values)
        assert first.attrs["dp_seeded"] == 1
        assert not np.array_equal(released(first), released(fit(model, random_seed=SEED + 1)))

    def test_the_seed_is_never_stored(self, model, tmp_path):
        """Whoever knows the seed can regenerate the noise and subtract it: it must not travel."""
        result = fit(model, random_seed=SEED)
        path = tmp_path / "seeded.nc"
        result.to_netcdf(path)
        content = path.read_bytes()
        assert str(SEED).encode() not in content
        for dtype in ("<i8", ">i8", "<u4", ">u4", "<f8", ">f8"):
            assert np.array(SEED, dtype=dtype).tobytes() not in content
        text = repr({node.path: dict(node.attrs) for node in xr.open_datatree(path).subtree})
        assert str(SEED) not in text

    def test_an_unseeded_fit_seeds_itself_from_os_entropy(self, model, monkeypatch):
        """SeedSequence(None) takes 128 bits from the OS; the fit's key is derived from them."""
        made = []
        original = np.random.SeedSequence

        def spy(entropy=None, *args, **kwargs):
            sequence = original(entropy, *args, **kwargs)
            made.append((entropy, sequence))
            return sequence

        monkeypatch.setattr(np.random, "SeedSequence", spy)
        fit(model)
        assert made and made[0][0] is None
        # 128 random bits: below 2^64 with probability 2^-64.
        assert made[0][1].entropy.bit_length() > 64

    def test_unseeded_keys_do_not_repeat(self):
        keys = {tuple(np.asarray(jax.random.key_data(jax_key(np.random.SeedSequence()))))
                for _ in range(1000)}
        assert len(keys) == 1000

    def test_the_documentation_says_a_seed_is_for_reproducibility_only(self):
        doc = " ".join(dpppl.sample.__doc__.split())
        assert "for reproducibility only" in doc
        assert "leave it None (OS entropy) for anything you publish" in doc


# -- noise hardened against floating-point attacks ----------------------------------------------


class TestDiscreteGaussian:
    @pytest.mark.parametrize("scale", [1.0, 2.5, 17.3])
    def test_matches_the_discrete_gaussian_pmf(self, scale):
        draws = np.asarray(discrete_gaussian(jax.random.key(int(scale * 10)), (200_000,), scale))
        assert draws.dtype == np.int64
        support = np.arange(-int(12 * scale) - 1, int(12 * scale) + 2)
        pmf = np.exp(-(support**2) / (2 * scale**2))
        pmf /= pmf.sum()
        observed = np.array([np.count_nonzero(draws == k) for k in support])
        assert observed.sum() == len(draws)
        expected = len(draws) * pmf
        keep = expected >= 5
        observed = np.append(observed[keep], observed[~keep].sum())
        expected = np.append(expected[keep], expected[~keep].sum())
        statistic = np.sum((observed - expected) ** 2 / expected)
        assert stats.chi2.sf(statistic, len(observed) - 1) > SIGNIFICANCE

    def test_the_wrong_scale_is_detected_by_the_same_test(self):
        draws = np.asarray(discrete_gaussian(jax.random.key(3), (200_000,), 2.5 * 1.02))
        variance = 2.5**2  # the discrete Gaussian's variance is within 1e-30 of scale² here
        statistic = np.sum(draws.astype(float) ** 2) / variance
        assert stats.chi2.sf(statistic, len(draws)) < SIGNIFICANCE

    def test_at_the_scales_of_a_snapped_release_it_is_gaussian_down_to_the_last_bit(self):
        """At s ≈ 2⁴⁰ the draws are N(0, s²) in law (χ² on 50 equiprobable bins), every draw is
        below the proven bound 64 s, and the low bits are uniform (χ² on the last 8 bits)."""
        scale = 1.3 * 2.0**40
        draws = np.asarray(discrete_gaussian(jax.random.key(11), (200_000,), scale))
        assert np.abs(draws).max() < NOISE_BOUND * scale
        edges = stats.norm.ppf(np.linspace(0, 1, 51)[1:-1]) * scale
        observed = np.bincount(np.searchsorted(edges, draws), minlength=50)
        statistic = np.sum((observed - len(draws) / 50) ** 2 / (len(draws) / 50))
        assert stats.chi2.sf(statistic, 49) > SIGNIFICANCE
        low = np.bincount(draws & 255, minlength=256)
        statistic = np.sum((low - len(draws) / 256) ** 2 / (len(draws) / 256))
        assert stats.chi2.sf(statistic, 255) > SIGNIFICANCE

    def test_runs_under_jit_with_a_traced_scale(self):
        draw = jax.jit(lambda k, s: discrete_gaussian(k, (4,), s))(jax.random.key(0), 3.0)
        assert draw.shape == (4,)

    def test_refuses_scales_below_one(self):
        with pytest.raises(ValueError, match="scale"):
            discrete_gaussian(jax.random.key(0), (3,), 0.5)

    def test_xla_exp_is_as_accurate_as_the_sampler_bound_assumes(self):
        """SAMPLER_TV assumes exp within 4 ulp; check it against mpmath where it is used."""
        mpmath = pytest.importorskip("mpmath")
        mpmath.mp.prec = 120
        x = -np.random.default_rng(0).uniform(0, 60, 20_000)
        y = np.asarray(jax.jit(jnp.exp)(jnp.asarray(x)))
        ulps = [abs(mpmath.mpf(b) - mpmath.exp(mpmath.mpf(a))) / mpmath.mpf(np.spacing(b))
                for a, b in zip(x, y, strict=True)]
        assert max(ulps) <= 4


class TestAcceptanceError:
    """The sampler's float64 acceptance probability is within a relative ρ = 288·2⁻⁵³ of the
    exact one where that is at least 2⁻⁶⁴ (what SAMPLER_LOG_RATIO = 2⁻⁴³ > 2ρ charges to ε),
    and never accepts elsewhere (what SAMPLER_TV charges to δ)."""

    @staticmethod
    def computed_and_exact(scale: float, w: np.ndarray):
        mpmath = pytest.importorskip("mpmath")
        mpmath.mp.prec = 200
        log2_t = round(math.log2(scale))
        t = 2.0**log2_t
        magnitude = np.unique(np.floor(scale * (w + scale / t)).astype(np.int64))
        magnitude = magnitude[(magnitude >= 0) & (magnitude < 45 * t)]
        low = magnitude % int(t)
        computed = np.asarray(jax.jit(acceptance)(
            jnp.asarray(magnitude, dtype=jnp.uint64), jnp.asarray(low, dtype=jnp.uint64),
            scale, t))
        s, tt = mpmath.mpf(scale), mpmath.mpf(t)
        exact = [mpmath.exp(-mpmath.mpf(int(u)) / tt - (mpmath.mpf(int(m)) / s - s / tt) ** 2 / 2)
                 for m, u in zip(magnitude, low, strict=True)]
        return computed, exact

    @pytest.mark.parametrize("scale", [37.9, 1000.3, 2.0**26 * 1.3, 2.0**40 * 0.77, 2.0**46])
    def test_the_relative_error_is_within_rho_where_the_acceptance_is_at_least_2_to_the_minus_64(
        self, scale
    ):
        t = 2.0 ** round(math.log2(scale))
        w = np.random.default_rng(1).uniform(-scale / t, 9.42, 20_000)
        computed, exact = self.computed_and_exact(scale, w)
        errors = [abs(c / e - 1) for c, e in zip(computed, exact, strict=True) if e >= 2.0**-64]
        assert len(errors) > 100
        assert max(errors) <= 288 * 2.0**-53
        # Not a loose bound: the error grows with w² as the derivation says.
        assert max(errors) > 10 * 2.0**-53

    @pytest.mark.parametrize("scale", [1000.3, 2.0**26 * 1.3, 2.0**46])
    def test_below_2_to_the_minus_64_the_test_never_accepts(self, scale):
        w = np.random.default_rng(2).uniform(9.4, 63.6, 20_000)
        computed, exact = self.computed_and_exact(scale, w)
        below = np.array([e < 2.0**-64 for e in exact])
        assert below.sum() > 100
        assert np.all(np.floor(computed[below] * 2.0**63) == 0)


class TestTotalVariationBound:
    @staticmethod
    def exact_distance(scale: int):
        """TV(N_Z(0, s²), round(N(0, s²))) by exact sums at 40 digits (tails beyond 40 s are
        below 10⁻³⁰⁰)."""
        mpmath = pytest.importorskip("mpmath")
        mpmath.mp.dps = 40
        s, half = mpmath.mpf(scale), mpmath.mpf(1) / 2
        support = range(-40 * scale, 40 * scale + 1)
        weights = [mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * s**2)) for k in support]
        total = mpmath.fsum(weights)
        rounded = [mpmath.ncdf((k + half) / s) - mpmath.ncdf((k - half) / s) for k in support]
        return float(mpmath.fsum(abs(w / total - r) for w, r in zip(weights, rounded, strict=True)) / 2)

    @pytest.mark.parametrize("scale", [1, 2, 5, 10])
    def test_bounds_the_exact_distance(self, scale):
        exact = self.exact_distance(scale)
        bound = discrete_gaussian_tv_bound(scale)
        assert exact <= bound <= 4 * exact  # an upper bound, and not a loose one
        # η = O(1/s²), with the leading constant 4 e^(−½) / (48 √(2π)) ≈ 0.0202.
        assert 0.015 < exact * scale**2 < 0.0202


class TestSnappedGaussianRelease:
    def test_outputs_lie_exactly_on_the_power_of_two_grid(self):
        grid = 2.0**-20
        values = jnp.array([[0.3, 0.3 + 1e-15, -1234.5678901, 1e-9]] * 3)
        out, exact = snapped_gaussian_release(jax.random.key(0), jnp.tile(values, 2500), 1.7,
                                              grid)
        steps = np.asarray(out) / grid
        assert bool(exact)
        np.testing.assert_array_equal(steps, np.round(steps))

    def test_inputs_closer_than_the_grid_give_the_same_output_distribution(self):
        """The low bits of the noise-free value do not reach the output at all."""
        key = jax.random.key(1)
        a, _ = snapped_gaussian_release(key, jnp.full((2, 1000), 0.1), 2.0, 2.0**-10)
        b, _ = snapped_gaussian_release(key, jnp.full((2, 1000), 0.1 + 2.0**-14), 2.0, 2.0**-10)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def test_noise_has_the_requested_standard_deviation(self):
        std, count = 3.7, 200_000
        out, _ = snapped_gaussian_release(jax.random.key(2), jnp.zeros((1, count)), std,
                                          2.0**-30)
        out = np.asarray(out)
        statistic = np.sum(out**2) / std**2
        assert stats.chi2.sf(statistic, count) > SIGNIFICANCE
        assert stats.chi2.cdf(statistic, count) > SIGNIFICANCE
        assert abs(out.mean()) < 5 * std / np.sqrt(count)

    def test_refuses_a_grid_that_is_not_a_power_of_two(self):
        with pytest.raises(ValueError, match="power of two"):
            snapped_gaussian_release(jax.random.key(0), jnp.zeros((1, 2)), 1.0, 0.3)

    def test_a_grid_too_fine_for_the_values_is_reported_and_refused(self):
        """64 rows of 2⁴⁸ grid steps each sum to 2⁵⁴ steps: inexact, so nothing may be released."""
        rows = jnp.full((2**6, 3), 2.0**24 * 2.0**-30)
        _, exact = snapped_gaussian_release(jax.random.key(3), rows, 2.0**-20, 2.0**-30)
        assert bool(exact)
        _, exact = snapped_gaussian_release(jax.random.key(3), rows * 2.0**24, 2.0**-20,
                                            2.0**-30)
        assert not bool(exact)
        with pytest.raises(InexactReleaseError, match="2\\*\\*53 grid steps") as error:
            require_exact(exact)
        assert "0." not in str(error.value)


class TestSnappedGaussian:
    def test_the_grid_is_the_finest_power_of_two_that_keeps_the_sum_in_range(self):
        release = SnappedGaussian.for_sum(capacity=3476, clipping_bound=5.0,
                                          noise_multiplier=1.2, dim=8)
        exponent = math.frexp(release.grid)[1] - 1
        assert release.grid == 2.0**exponent

        def spread(grid):
            return 3476 * 5.0 + 64 * 1.2 * (5.0 + grid * math.sqrt(8))

        assert spread(release.grid) < 2.0**50 * release.grid
        assert spread(release.grid / 2) >= 2.0**50 * release.grid / 2
        assert release.sensitivity == 5.0 + release.grid * math.sqrt(8)
        assert release.scale >= MIN_SCALE

    def test_too_little_noise_for_the_range_is_refused(self):
        with pytest.raises(InvalidPrivacyParameterError, match="noise scale"):
            SnappedGaussian.for_sum(capacity=10**6, clipping_bound=1.0, noise_multiplier=1e-3,
                                    dim=4)

    def test_the_delta_cost_grows_with_steps_coordinates_and_epsilon(self):
        cost = SnappedGaussian.delta_cost(steps=10_000, dim=20, epsilon=1.0)
        per_draw = discrete_gaussian_tv_bound(MIN_SCALE) + 2.0**-56
        assert cost == pytest.approx((1 + math.e) * 10_000 * 20 * per_draw)
        assert cost < 2e-11  # 3.5·10⁻⁹ before the relative error went to ε

    def test_the_max_divergence_grows_with_steps_and_coordinates_only(self):
        assert SnappedGaussian.max_divergence(steps=10_000, dim=20) == 200_000 * 2.0**-43


class TestHardenedNADPVI:
    """NA-DPVI releases its noisy gradient sums snapped by default; float noise on request."""

    def test_every_released_sum_is_an_exact_multiple_of_the_planned_grid(self, model):
        result = fit(model, random_seed=SEED)
        details = json.loads(result.attrs["dp_privacy_details"])
        grid = details["grid"]
        assert grid == 2.0 ** (math.frexp(grid)[1] - 1)
        assert 0 < details["snapping_delta"] < 1e-9
        assert (details["accountant_delta"] + details["truncation_delta"]
                + details["snapping_delta"]) <= result.attrs["dp_delta"]
        trace = result["dpvi_trace"]
        steps = trace["noisy_sum"].values / grid
        np.testing.assert_array_equal(steps, np.round(steps))
        assert np.abs(steps).max() < 2.0**50
        # The preconditioner β beside them is public: fixed from the start here (no burn-in), it
        # is the one the mechanism's settings name, at every step.
        settings = json.loads(result.attrs["dp_mechanism_attrs"])
        beta = np.array(settings["preconditioning_mu"] + [settings["preconditioning_u"]])
        np.testing.assert_array_equal(
            trace["preconditioner"].values, np.broadcast_to(beta, trace["noisy_sum"].shape)
        )
        assert json.loads(result.attrs["dp_mechanism_settings"])["noise"] == "snapped"

    def test_the_float_release_is_still_available_and_labelled(self, model):
        result = fit(model, noise="float", random_seed=SEED)
        assert json.loads(result.attrs["dp_mechanism_settings"])["noise"] == "float"
        details = json.loads(result.attrs["dp_privacy_details"])
        assert details["noise"] == "float"
        assert "grid" not in details and "snapping_delta" not in details
        assert np.isfinite(result["dpvi_trace"]["noisy_sum"].values).all()
