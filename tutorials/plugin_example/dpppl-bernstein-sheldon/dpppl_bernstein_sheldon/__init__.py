"""dpppl-bernstein-sheldon: noisy sufficient statistics with a noise-aware posterior, for
exponential-family models (Bernstein & Sheldon, NeurIPS 2018), as a dpppl mechanism plugin."""

from dpppl_bernstein_sheldon.mechanism import BernsteinSheldon

__all__ = ["BernsteinSheldon"]
