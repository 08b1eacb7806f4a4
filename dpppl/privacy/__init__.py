"""The privacy vocabulary and the primitives every mechanism's guarantee rests on.

budget
    Valid (ε, δ) targets, and what a total-variation distance costs in δ.
events
    :class:`PrivacyEvent`: what a mechanism declares and accountants read.
noise_calibration
    The search for the smallest noise multiplier whose ε meets a target.
subsampling
    Poisson subsampling as fixed-shape batches.
noise
    Clipping, Gaussian noise, PRNG keys, and the snapped discrete-Gaussian release.
"""
