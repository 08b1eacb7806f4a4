"""The model as records: a PyMC model split into per-record log-likelihood terms, compiled to JAX.

record_structure
    Which observed variables and data hold one entry per record, and how to gather them.
record_model
    :class:`RecordModel`: the per-record log-likelihood, the prior, the ELBO and their gradients.
locality
    The proof, on the compiled JAX program, that record i's term reads only row i.
jax_compile
    PyTensor → JAX compilation and the persistent XLA cache.
simulation
    Drawing parameters and data sets from the model's prior (for TARP studies).
"""
