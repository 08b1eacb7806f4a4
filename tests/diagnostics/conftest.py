"""Simulations with a known exact posterior, shared by the diagnostics tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest


@dataclass(frozen=True)
class ConjugateNormal:
    """K simulations of a Normal–Normal model with known variance, and S standard-normal draws.

    θ_k ~ N(0, I_d) and the data summary ȳ_k ~ N(θ_k, 0.5² I_d), so the exact posterior of
    simulation k is N(m_k, s² I_d) with s² = 1 / (1 + 1/0.5²) and m_k = s² ȳ_k / 0.5².
    """

    truth: np.ndarray  # (K, d)
    post_mean: np.ndarray  # (K, d)
    post_sd: float
    noise: np.ndarray  # (K, S, d)

    def samples(self, scale: float = 1.0, bias: float = 0.0) -> np.ndarray:
        """Draws from N(m_k + bias·s, (scale·s)²): exact when scale = 1 and bias = 0."""
        return self.post_mean[:, np.newaxis, :] + self.post_sd * (scale * self.noise + bias)


def conjugate_normal(n_sims: int, n_draws: int, n_params: int, seed: int) -> ConjugateNormal:
    rng = np.random.default_rng(seed)
    noise_sd = 0.5
    truth = rng.normal(size=(n_sims, n_params))
    ybar = truth + noise_sd * rng.normal(size=(n_sims, n_params))
    post_var = 1.0 / (1.0 + 1.0 / noise_sd**2)
    return ConjugateNormal(
        truth=truth,
        post_mean=post_var * ybar / noise_sd**2,
        post_sd=float(np.sqrt(post_var)),
        noise=rng.normal(size=(n_sims, n_draws, n_params)),
    )


@pytest.fixture(scope="session")
def conjugate() -> ConjugateNormal:
    """K = 500 simulations (the paper's K), S = 1000 draws, d = 3."""
    return conjugate_normal(500, 1000, 3, seed=20250)


@pytest.fixture(scope="session")
def small_conjugate() -> ConjugateNormal:
    """A small case for tests about shapes, plots and I/O rather than statistics."""
    return conjugate_normal(60, 200, 3, seed=7)


@pytest.fixture(scope="session")
def make_conjugate():
    """The generator itself, for tests that need their own sizes."""
    return conjugate_normal
