"""A TARP study's workers get no private data (review F2).

The study computes only on simulated data, so its workers need the model's structure and public
inputs, never its records.  Each test runs a study on real worker processes (local ``spawn``
processes or a Dask cluster) with a model whose record arrays hold canaries, records what is
really sent to the workers, and searches those bytes: every float value of the records (and
their aggregates), a large integer count, and the record coordinates' labels.  The non-record
``pm.Data`` (prior scales) is public model structure and may travel.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
import xarray as xr

import dpppl
from dpppl.model.record_model import RecordModel, record_model
from dpppl.model.record_structure import without_records
from dpppl.model.simulation import simulator
from dpppl.testing import example_models, find_in_bytes

N = 30
FLOAT_CANARY = 7.123456789
BIG_CANARY = 987654321.5
COUNT_CANARY = 123456789
LABEL_CANARY = "patient-7f3a9c-"
NA_DPVI_FAST = {"steps": 20, "burn_in": 0.0, "chains": 1, "mc_draws": 2, "posterior": "naive",
                "inference": "laplace", "tune": 20, "draws": 20}
STUDY = {"mechanism": "na-dpvi", "epsilon": 1.0, "delta": 1e-3, "n_simulations": 4,
         "n_repeats": 2, "random_seed": 0, "progressbar": False, **NA_DPVI_FAST}
PUBLIC_X = np.linspace(-1.0, 1.0, 12)


def canary_model() -> pm.Model:
    """A regression whose covariate (``pm.Data``), outcome (numpy) and count (``pm.Data``)
    hold canaries, with record coordinates that are identifiers, and a public prior-scale
    ``pm.Data``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=N)
    y = 1 + 2 * x + rng.normal(size=N)
    counts = rng.poisson(3, N)
    x[3], y[5], y[9], counts[11] = FLOAT_CANARY, BIG_CANARY, FLOAT_CANARY, COUNT_CANARY
    with pm.Model(coords={"obs": [f"{LABEL_CANARY}{i}" for i in range(N)]}) as model:
        X = pm.Data("X", x, dims="obs")
        scale = pm.Data("prior_scale", np.array([5.0, 5.0]))
        intercept = pm.Normal("intercept", 0, scale[0])
        slope = pm.Normal("slope", 0, scale[1])
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", intercept + slope * X, sigma, observed=y, dims="obs")
        count = pm.Data("count_data", counts, dims="obs")
        pm.Poisson("count", pm.math.exp(intercept / 10), observed=count, dims="obs")
    return model


def canaries_in(blob: bytes, data: dict[str, np.ndarray]) -> list[str]:
    """The canaries (and any float record value or aggregate) found in ``blob``."""
    found = find_in_bytes(blob, data)
    # pm.Data keeps integers as int32; a numpy observation would be int64.
    if any(np.array(COUNT_CANARY, dtype=t).tobytes() in blob for t in ("<i4", "<i8")):
        found.append("the integer count canary")
    if LABEL_CANARY.encode() in blob:
        found.append("a record coordinate's label")
    return found


def assert_no_canary(blob: bytes, data: dict[str, np.ndarray], where: str) -> None:
    found = canaries_in(blob, data)
    assert not found, f"{len(found)} private values in {where}, e.g. {found[:2]}"


@pytest.fixture(scope="module")
def model():
    return canary_model()


@pytest.fixture(scope="module")
def private(model):
    return record_model(model).data()


@pytest.fixture(scope="module")
def in_process(model):
    """The study run in this process: what the workers must reproduce."""
    return dpppl.tarp(model, covariates={"X": PUBLIC_X}, n_workers=1, **STUDY)


@pytest.fixture
def sent_to_processes(monkeypatch):
    """Every task submitted to a local worker process, pickled as the pool pickles it."""
    sent: list[bytes] = []
    submit = ProcessPoolExecutor.submit

    def recording_submit(self, fn, /, *args, **kwargs):
        sent.append(bytes(ForkingPickler.dumps((fn, args, kwargs))))
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", recording_submit)
    return sent


def test_the_canaries_are_found_where_they_are(model, private):
    """The search has teeth: the model itself, pickled, holds every kind of canary."""
    found = canaries_in(cloudpickle.dumps(model), private)
    assert any("'X'" in hit for hit in found) and any("'y'" in hit for hit in found)
    assert "the integer count canary" in found and "a record coordinate's label" in found


def test_local_worker_processes_get_no_private_data(
    model, private, in_process, sent_to_processes
):
    study = dpppl.tarp(model, covariates={"X": PUBLIC_X}, n_workers=2, **STUDY)
    assert sent_to_processes, "no task went to a worker process"
    for blob in sent_to_processes:
        assert_no_canary(blob, private, "a task sent to a worker process")
    assert np.all(np.isfinite(study["ecp"].values))
    xr.testing.assert_identical(study.drop_attrs(), in_process.drop_attrs())


def test_a_fit_with_a_tarp_study_sends_its_workers_no_private_data(
    model, private, sent_to_processes
):
    with model:
        result = dpppl.sample(
            mechanism="na-dpvi", epsilon=1.0, delta=1e-3, random_seed=1, progressbar=False,
            tarp={"covariates": {"X": PUBLIC_X}, "n_workers": 2, "n_simulations": 4,
                  "n_repeats": 2, "random_seed": 0},
            **NA_DPVI_FAST,
        )
    assert sent_to_processes, "no task went to a worker process"
    for blob in sent_to_processes:
        assert_no_canary(blob, private, "a task sent to a worker process")
    assert np.all(np.isfinite(result["tarp"]["ecp"].values))


def test_a_dask_cluster_gets_no_private_data(model, private, in_process, monkeypatch):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    from distributed.protocol import pickle as dask_pickle

    class ReceivedTasks(distributed.WorkerPlugin):
        """Keeps every task its worker runs, pickled again: what the worker received."""

        def setup(self, worker) -> None:
            self.worker = worker
            self.received: list[bytes] = []

        def transition(self, key, start, finish, **kwargs) -> None:
            if finish == "executing":
                self.received.append(cloudpickle.dumps(self.worker.state.tasks[key].run_spec))

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:
        client.register_plugin(ReceivedTasks(), name="received-tasks")
        submitted: list[bytes] = []
        map_tasks = client.map

        def recording_map(func, *iterables, **kwargs):
            submitted.append(dask_pickle.dumps((func, iterables)))
            return map_tasks(func, *iterables, **kwargs)

        monkeypatch.setattr(client, "map", recording_map)
        study = dpppl.tarp(model, covariates={"X": PUBLIC_X}, client=client, **STUDY)
        received = client.run(lambda dask_worker: dask_worker.plugins["received-tasks"].received)

    assert submitted, "nothing was submitted to the cluster"
    tasks = [blob for blobs in received.values() for blob in blobs]
    assert tasks, "no worker ran a task"
    for blob in tasks:
        assert_no_canary(blob, private, "a task a Dask worker received")
    for blob in submitted:
        assert_no_canary(blob, private, "what was submitted to the cluster")
    xr.testing.assert_identical(study.drop_attrs(), in_process.drop_attrs())


# -- the data-free copy of a model ------------------------------------------------------------


def lkj_mvnormal(rng: np.random.Generator) -> pm.Model:
    """An LKJ prior and a multivariate record."""
    with pm.Model(coords={"obs": range(N), "d": range(3)}) as model:
        chol, _, _ = pm.LKJCholeskyCov(
            "chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3), compute_corr=True
        )
        mu = pm.Normal("mu", 0, 1, dims="d")
        pm.MvNormal("y", mu, chol=chol, observed=rng.normal(size=(N, 3)), dims=("obs", "d"))
    return model


def record_potential(rng: np.random.Generator) -> pm.Model:
    """A potential with one term per record, reading a covariate."""
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 1)
        X = pm.Data("X", rng.normal(size=N), dims="obs")
        pm.Potential("per_record", -((X - mu) ** 2), dims="obs")
        pm.Normal("y", mu, 1, observed=rng.normal(size=N), dims="obs")
    return model


def numpy_covariates(rng: np.random.Generator) -> pm.Model:
    """Two numpy covariates (x and x², separate constants in the graph), no dims, and an
    initial value given as an expression."""
    x = rng.normal(size=N)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1, initval=pm.Data("start", 0.25) * 2)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", a + b * x + b * x**2, 1, observed=rng.normal(size=N))
    return model


def ordered_mixture(rng: np.random.Generator) -> pm.Model:
    """A mixture with an ordered transform and initial values (PyMC keeps its observations in
    the variable's tag too)."""
    with pm.Model(coords={"obs": range(N), "c": range(2)}) as model:
        w = pm.Dirichlet("w", np.ones(2), dims="c")
        means = pm.Normal(
            "means", [-1, 1], 1, dims="c", transform=pm.distributions.transforms.ordered,
            initval=np.array([-1.0, 1.0]),
        )
        pm.NormalMixture("y", w=w, mu=means, sigma=1, observed=rng.normal(size=N), dims="obs")
    return model


MODELS = {
    **example_models(),
    **{f.__name__: f for f in (lkj_mvnormal, record_potential, numpy_covariates, ordered_mixture)},
    "canaries": lambda rng: canary_model(),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_data_free_copy_holds_no_record_and_compiles_to_the_same_record_model(name):
    model = MODELS[name](np.random.default_rng(0))
    original = record_model(model)
    data = {key: values.copy() for key, values in original.data().items()}
    copy, structure = without_records(model, original.structure)

    assert_no_canary(cloudpickle.dumps((copy, structure)), data, "the pickled copy")
    assert structure.n_records == 1 and structure.names == original.structure.names
    for key, values in record_model(model).data().items():  # the model keeps its own data
        np.testing.assert_array_equal(values, data[key])
    copied = RecordModel(copy, structure)
    assert copied.parameters == original.parameters
    np.testing.assert_array_equal(copied.initial_point(), original.initial_point())
    theta = jnp.asarray(original.initial_point() + 0.1 * np.arange(original.n_params))
    np.testing.assert_allclose(copied.loglik(theta, data), original.loglik(theta, data),
                               rtol=1e-12)
    np.testing.assert_allclose(copied.logprior(theta), original.logprior(theta), rtol=1e-12)
    if model.potentials:
        return  # a model with a potential cannot be simulated from
    seed = np.random.SeedSequence(3)
    prior, copied_prior = simulator(original).prior(seed), simulator(copied).prior(seed)
    np.testing.assert_array_equal(copied_prior.theta, prior.theta)
    covariates = {name: data[name] for name in simulator(original).covariate_names}
    simulated = simulator(original).data(prior.theta, seed, covariates=covariates or None,
                                         n_records=None if covariates else 7)
    copied_simulated = simulator(copied).data(prior.theta, seed, covariates=covariates or None,
                                              n_records=None if covariates else 7)
    for key, values in simulated.items():
        np.testing.assert_array_equal(copied_simulated[key], values)


def test_the_copy_keeps_public_structure_and_drops_record_coordinates(model):
    copy, _ = without_records(model, record_model(model).structure)
    np.testing.assert_array_equal(copy["prior_scale"].get_value(), [5.0, 5.0])
    assert copy.coords["obs"] is None
    assert len(model.coords["obs"]) == N  # the original keeps its own
