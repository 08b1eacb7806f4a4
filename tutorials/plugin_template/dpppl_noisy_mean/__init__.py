"""dpppl-noisy-mean: a template dpppl mechanism plugin."""

from dpppl_noisy_mean.mechanism import NoisyMean

__all__ = ["NoisyMean"]
