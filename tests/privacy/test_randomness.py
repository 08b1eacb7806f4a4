"""Where the noise comes from: OS entropy unless a seed is given, a seed only reproduces and is never
stored, and a noise primitive hardened against floating-point attacks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
import xarray as xr
from scipy import stats

import dpppl
from dpppl.privacy import discrete_gaussian, jax_key, snapped_gaussian_release

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
    return result["dpvi_trace"]["noisy_grad"].values


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

    def test_runs_under_jit(self):
        draw = jax.jit(lambda k: discrete_gaussian(k, (4,), 3.0))(jax.random.key(0))
        assert draw.shape == (4,)

    def test_refuses_scales_below_one(self):
        with pytest.raises(ValueError, match="scale"):
            discrete_gaussian(jax.random.key(0), (3,), 0.5)


class TestSnappedGaussianRelease:
    def test_outputs_lie_exactly_on_the_power_of_two_grid(self):
        grid = 2.0**-20
        values = jnp.array([0.3, 0.3 + 1e-15, -1234.5678901, 1e-9])
        out = np.asarray(snapped_gaussian_release(jax.random.key(0),
                                                  jnp.tile(values, 2500), 1.7, grid))
        steps = out / grid
        np.testing.assert_array_equal(steps, np.round(steps))

    def test_inputs_closer_than_the_grid_give_the_same_output_distribution(self):
        """The low bits of the noise-free value do not reach the output at all."""
        key = jax.random.key(1)
        a = snapped_gaussian_release(key, jnp.full(1000, 0.1), 2.0, 2.0**-10)
        b = snapped_gaussian_release(key, jnp.full(1000, 0.1 + 2.0**-14), 2.0, 2.0**-10)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def test_noise_has_the_requested_standard_deviation(self):
        std, count = 3.7, 200_000
        out = np.asarray(snapped_gaussian_release(jax.random.key(2), jnp.zeros(count), std))
        statistic = np.sum(out**2) / std**2
        assert stats.chi2.sf(statistic, count) > SIGNIFICANCE
        assert stats.chi2.cdf(statistic, count) > SIGNIFICANCE
        assert abs(out.mean()) < 5 * std / np.sqrt(count)

    def test_refuses_a_grid_that_is_not_a_power_of_two(self):
        with pytest.raises(ValueError, match="power of two"):
            snapped_gaussian_release(jax.random.key(0), jnp.zeros(2), 1.0, 0.3)
