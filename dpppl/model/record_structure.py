"""Finding the records in a PyMC model.

A model is privatised record by record: its likelihood must factorise over N exchangeable records
along one leading dimension shared by the observed variables and the data they depend on.  This
module finds that dimension and those variables, and refuses models without such structure with a
message that says what to change.  It looks only at the model's graph, shapes and dims; the only
thing it reads from the data is whether they are finite, and no message carries a data value.
:func:`without_records` copies a model without its records, for processes that must not see them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor
from pymc.model.fgraph import (
    ModelFreeRV,
    ModelNamed,
    ModelObservedRV,
    ModelPotential,
    ModelVar,
    fgraph_from_model,
    model_from_fgraph,
)
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.scalar import Cast
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.random.basic import BernoulliRV, CategoricalRV

from dpppl.errors import InvalidDataError, ModelNotSupportedError

_MARGINALISE_HINT = (
    "marginalise it out of the model (for a mixture label use pm.NormalMixture or pm.Mixture; "
    "pymc-extras' marginalize does it for other finite discrete variables)"
)


@dataclass(frozen=True)
class RecordVariable:
    """One array of the model that holds a value per record (a covariate or an observation)."""

    name: str
    variable: Variable
    trailing_shape: tuple[int, ...]
    dtype: str

    def value(self) -> np.ndarray:
        """The array the model currently holds (private data: never log or return it)."""
        if isinstance(self.variable, SharedVariable):
            return np.asarray(self.variable.get_value(borrow=True))
        return np.asarray(self.variable.data)


@dataclass(frozen=True)
class RecordStructure:
    """Which parts of a model are per record.

    Attributes
    ----------
    dim
        Name of the record dimension when the model has dims, else None.
    n_records
        N, the number of records the model holds now.
    variables
        The per-record arrays: covariates in ``pm.Data`` (or numpy constants) and observed values.
    observed
        The observed random variables (their leading batch axis is the record axis).
    record_potentials, prior_potentials
        ``pm.Potential`` terms that do and do not depend on record data.
    dim_length
        The model's symbolic length of the record dimension, if any.
    """

    dim: str | None
    n_records: int
    variables: tuple[RecordVariable, ...]
    observed: tuple[Variable, ...]
    record_potentials: tuple[Variable, ...]
    prior_potentials: tuple[Variable, ...]
    dim_length: Variable | None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables)

    def data(self) -> dict[str, np.ndarray]:
        """The model's own record arrays, by name (the private data set)."""
        return {v.name: v.value() for v in self.variables}


def uncast(variable: Variable) -> Variable:
    """The data behind PyMC's cast of an observed ``pm.Data`` to an integer likelihood's dtype."""
    owner = variable.owner
    if owner is not None and isinstance(owner.op, Elemwise) and isinstance(owner.op.scalar_op, Cast):
        return owner.inputs[0]
    return variable


def value_of(variable: Variable) -> np.ndarray:
    """The array a model variable holds now: a ``pm.Data``, a numpy constant, or an expression of
    them (private data: read it for its shape or to fit, never log or return it)."""
    if isinstance(variable, SharedVariable):
        return np.asarray(variable.get_value(borrow=True))
    if isinstance(variable, Constant):
        return np.asarray(variable.data)
    # An expression of data, e.g. PyMC's cast of a float pm.Data to an integer observation.
    return np.asarray(variable.eval())


def _leading_dim(model: pm.Model, name: str | None) -> str | None:
    dims = model.named_vars_to_dims.get(name) if name else None
    return dims[0] if dims else None


def _check_free_variables(model: pm.Model, dim: str | None) -> None:
    for rv in model.free_RVs:
        if rv.dtype.startswith(("int", "uint", "bool")):
            raise ModelNotSupportedError(
                f"free variable {rv.name!r} is discrete; dpppl's mechanisms need continuous "
                f"parameters: {_MARGINALISE_HINT}"
            )
        if dim is not None and dim in (model.named_vars_to_dims.get(rv.name) or ()):
            raise ModelNotSupportedError(
                f"free variable {rv.name!r} has the record dimension {dim!r}: a latent variable per "
                "record would be released along with the posterior; dpppl supports only global "
                "parameters. Integrate it out (for example with a marginal likelihood) or make it "
                "global"
            )


def _check_no_imputation(model: pm.Model) -> None:
    free_names = {rv.name for rv in model.free_RVs}
    for rv in model.observed_RVs:
        if rv.name.endswith("_observed") and rv.name[: -len("_observed")] + "_unobserved" in free_names:
            raise InvalidDataError(
                f"observed variable {rv.name[: -len('_observed')]!r} has missing values, which PyMC "
                "would impute as per-record latent variables; dpppl does not release those. Drop or "
                "impute the incomplete records before fitting"
            )


def _record_dimension(
    model: pm.Model, records: str | None
) -> tuple[str | None, int]:
    observed = model.observed_RVs
    leading: list[tuple[str, str | None, int]] = []
    for rv in observed:
        value = value_of(model.rvs_to_values[rv])
        ndim_supp = getattr(rv.owner.op, "ndim_supp", 0)
        if value.ndim == 0 or value.ndim - ndim_supp < 1:
            raise ModelNotSupportedError(
                f"observed variable {rv.name!r} has no per-record axis (its shape is "
                f"{value.shape} with {ndim_supp} support dimension(s)): dpppl needs a likelihood "
                "that factorises over records along a leading dimension, e.g. dims=('obs',)"
            )
        leading.append((rv.name, _leading_dim(model, rv.name), value.shape[0]))

    if records is not None:
        if records not in model.coords:
            raise ModelNotSupportedError(
                f"records={records!r} is not a dimension of the model; its dimensions are "
                f"{sorted(model.coords)}"
            )
        for name, dim, _ in leading:
            if dim != records:
                raise ModelNotSupportedError(
                    f"observed variable {name!r} does not have {records!r} as its first dimension "
                    f"(its dims are {model.named_vars_to_dims.get(name)}); give every observed "
                    f"variable dims=({records!r}, ...)"
                )
        return records, int(model.dim_lengths[records].eval())

    dims = {dim for _, dim, _ in leading}
    lengths = {n for _, _, n in leading}
    if len(lengths) > 1 or (len(dims) > 1 and None not in dims):
        described = ", ".join(
            f"{name!r} (first dim {dim!r}, length {n})" for name, dim, n in leading
        )
        raise ModelNotSupportedError(
            f"the observed variables disagree on the record dimension: {described}. Every observed "
            "variable needs the same number of records along its first axis; name the record "
            "dimension with records='...'"
        )
    named = [d for d in dims if d is not None]
    return (named[0] if named else None), lengths.pop()


def _likelihood_inputs(model: pm.Model, terms: list[Variable]) -> list[Variable]:
    """Shared and constant arrays the likelihood terms read, not looking inside the prior."""
    values = set(model.rvs_to_values.values())
    return [
        v
        for v in ancestors(terms, blockers=model.free_RVs)
        if isinstance(v, (SharedVariable, Constant)) and v not in values
    ]


def _is_record_array(model: pm.Model, variable: Variable, dim: str | None, n: int) -> bool:
    if getattr(variable.type, "ndim", 0) == 0:
        return False
    dims = model.named_vars_to_dims.get(variable.name) if variable.name else None
    if dims and dim is not None and model.named_vars.get(variable.name) is variable:
        return dims[0] == dim
    return value_of(variable).shape[0] == n


def _check_finite(name: str, value: np.ndarray) -> None:
    if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
        raise InvalidDataError(
            f"record data {name!r} contain NaN or infinite values; remove or impute the affected "
            "records before fitting (dpppl does not say which records: that would leak them)"
        )
    if value.dtype.kind not in "biufc":
        raise InvalidDataError(
            f"record data {name!r} have dtype {value.dtype}, which is not numeric; encode it "
            "as numbers (e.g. one-hot columns) in the model"
        )


def finite_support(rv: Variable) -> np.ndarray | None:
    """The values an observation of ``rv`` can take, when its distribution alone makes them few
    and known: {0, 1} for a Bernoulli, {0, …, K − 1} for a Categorical over K categories fixed
    by the model's shapes; None otherwise.  Public: it comes from the model, not the data."""
    op = rv.owner.op
    if isinstance(op, BernoulliRV):
        return np.arange(2)
    if isinstance(op, CategoricalRV):
        categories = rv.owner.inputs[-1].type.shape[-1]
        return None if categories is None else np.arange(categories)
    return None


#: Likelihoods whose observations cannot be negative whatever the parameters (which of them
#: also exclude 0 depends on the parameters, so only negative values are refused).
_NON_NEGATIVE_LIKELIHOODS = frozenset(
    {
        "PoissonRV",
        "NegBinomialRV",
        "ExponentialRV",
        "GammaRV",
        "InvGammaRV",
        "LogNormalRV",
        "HalfNormalRV",
        "HalfCauchyRV",
        "HalfStudentTRV",
        "WeibullRV",
        "ChiSquareRV",
        "WaldRV",
    }
)


def _support_bounds(rv: Variable) -> tuple[object, object, str]:
    """Bounds every observation of ``rv`` lies within whatever the free parameters are: numbers,
    model expressions (evaluated when they do not depend on a free parameter) or None; and how
    to say them without their values, which may come from private covariates."""
    op = rv.owner.op
    name = type(op).__name__
    params = op.dist_params(rv.owner) if hasattr(op, "dist_params") else ()
    if name in ("BinomialRV", "BetaBinomialRV"):
        return 0, params[0], "from 0 to its number of trials n"
    if name == "DiscreteUniformRV":
        return params[0], params[1], "from its lower to its upper bound"
    if name == "GeometricRV":
        return 1, None, "from 1 up"
    if name == "BetaRV":
        return 0, 1, "from 0 to 1"
    if name in _NON_NEGATIVE_LIKELIHOODS:
        return 0, None, "from 0 up"
    return None, None, ""


def _bound_value(model: pm.Model, bound: object) -> np.ndarray | None:
    """A bound as numbers, or None where there is none or it depends on a free parameter."""
    if bound is None:
        return None
    if not isinstance(bound, Variable):
        return np.asarray(bound)
    if set(ancestors([bound])) & set(model.free_RVs):
        return None
    return value_of(bound)


def _check_support(model: pm.Model, rv: Variable, value: np.ndarray) -> None:
    """Refuse observations that ``rv``'s likelihood gives probability 0 for every value of the
    parameters: they would add nothing to the fit but silently drop out of it.  ``value`` is the
    record array as held, before any cast PyMC applies to an integer likelihood (which would turn
    2.5 into 2)."""
    likelihood = type(rv.owner.op).__name__.removesuffix("RV")
    advice = (
        "; recode or remove those records before fitting (dpppl does not say which records: "
        "that would leak them)"
    )
    support = finite_support(rv)
    if support is not None and not np.isin(value, support).all():
        raise InvalidDataError(
            f"observed variable {rv.name!r} holds values its {likelihood} likelihood gives "
            f"probability 0 (it allows {support.min()} to {support.max()})" + advice
        )
    if rv.type.dtype.startswith(("int", "uint")) and not np.array_equal(value, np.round(value)):
        raise InvalidDataError(
            f"observed variable {rv.name!r} holds values that are not whole numbers, which its "
            f"{likelihood} likelihood counts" + advice
        )
    lower, upper, allowed = _support_bounds(rv)
    lower, upper = _bound_value(model, lower), _bound_value(model, upper)
    outside = (lower is not None and np.any(value < lower)) or (
        upper is not None and np.any(value > upper)
    )
    if outside:
        raise InvalidDataError(
            f"observed variable {rv.name!r} holds values its {likelihood} likelihood gives "
            f"probability 0 (it allows values {allowed})" + advice
        )


def pymc_model(model: object | None = None) -> pm.Model:
    """The PyMC model to privatise: ``model``, the one of the ``with`` context, or the one a Bambi
    model builds (``bambi.Model``, built here if it is not yet).

    Raises
    ------
    ModelNotSupportedError
        For a Bambi model with ``auto_scale=True`` (Bambi's default): it sets priors from the
        means and standard deviations of the data, a use of the private data that no guarantee
        covers.
    TypeError
        For anything else.
    """
    if model is None or isinstance(model, pm.Model):
        return pm.modelcontext(model)
    # Recognised by its package rather than imported: Bambi is optional and slow to import.
    if type(model).__module__.split(".")[0] == "bambi" and hasattr(model, "backend"):
        if model.auto_scale:
            raise ModelNotSupportedError(
                "this Bambi model has auto_scale=True, Bambi's default, which sets the priors "
                "from the means and standard deviations of the data: no privacy guarantee covers "
                "that. Build it with bambi.Model(..., auto_scale=False, priors={...}) and priors "
                "chosen without looking at the data"
            )
        if not model.built:
            model.build()
        return model.backend.model
    raise TypeError(f"model must be a pymc.Model or a bambi.Model, got {type(model).__name__}")


def find_records(model: pm.Model, records: str | None = None) -> RecordStructure:
    """Find the record dimension, the per-record arrays and the likelihood terms of ``model``.

    Parameters
    ----------
    model
        A PyMC model whose likelihood factorises over records.
    records
        Name of the record dimension; found from the observed variables when None.

    Raises
    ------
    ModelNotSupportedError
        If the model has no observed variable, no common record dimension, discrete or per-record
        latent variables, or a potential that depends on the data without being per record.
    InvalidDataError
        If record data are missing, empty, non-numeric, NaN or infinite.
    """
    if not model.observed_RVs:
        raise ModelNotSupportedError(
            "the model has no observed variable: dpppl privatises a likelihood, so pass the "
            "sensitive data as observed=... (and covariates as pm.Data)"
        )
    _check_no_imputation(model)
    dim, n_records = _record_dimension(model, records)
    if n_records == 0:
        raise InvalidDataError("the model holds no records (its record dimension has length 0)")
    _check_free_variables(model, dim)

    observed = list(model.observed_RVs)
    candidates = _likelihood_inputs(model, observed)
    variables: list[RecordVariable] = []
    seen: set[Variable] = set()
    constants = 0
    for var in candidates:
        if var in seen or not _is_record_array(model, var, dim, n_records):
            continue
        seen.add(var)
        if isinstance(var, SharedVariable):
            name = var.name
        else:
            name = f"covariate_{constants}"
            constants += 1
        value = value_of(var)
        variables.append(RecordVariable(name, var, value.shape[1:], str(value.dtype)))
    for rv in observed:
        value_var = model.rvs_to_values[rv]
        roots = (
            [value_var]
            if value_var.owner is None
            else [
                v
                for v in ancestors([value_var])
                if isinstance(v, (SharedVariable, Constant))
                and _is_record_array(model, v, dim, n_records)
            ]
        )
        for root in roots:
            if root in seen:
                continue
            seen.add(root)
            value = value_of(root)
            name = root.name if isinstance(root, SharedVariable) and root.name else rv.name
            variables.append(RecordVariable(name, root, value.shape[1:], str(value.dtype)))
    for variable in variables:
        _check_finite(variable.name, variable.value())
    for rv in observed:
        _check_support(model, rv, value_of(uncast(model.rvs_to_values[rv])))

    dim_length = model.dim_lengths.get(dim) if dim is not None else None
    record_roots = {v.variable for v in variables} | ({dim_length} if dim_length is not None else set())

    for rv in model.free_RVs:
        if record_roots & set(ancestors([rv])):
            raise ModelNotSupportedError(
                f"free variable {rv.name!r} depends on the record data or the number of records: "
                "dpppl supports only global parameters whose prior does not look at the data"
            )

    record_potentials, prior_potentials = [], []
    for potential in model.potentials:
        if record_roots & set(ancestors([potential], blockers=model.free_RVs)):
            if potential.type.ndim == 0:
                raise ModelNotSupportedError(
                    f"pm.Potential {potential.name!r} depends on the record data but has no "
                    "per-record axis; give it one entry per record (leading dimension of length "
                    "N) so each record's contribution can be bounded"
                )
            record_potentials.append(potential)
        else:
            prior_potentials.append(potential)

    return RecordStructure(
        dim=dim,
        n_records=n_records,
        variables=tuple(variables),
        observed=tuple(observed),
        record_potentials=tuple(record_potentials),
        prior_potentials=tuple(prior_potentials),
        dim_length=dim_length,
    )


def without_records(
    model: pm.Model, structure: RecordStructure
) -> tuple[pm.Model, RecordStructure]:
    """A copy of ``model`` that holds no record, and the record structure of the copy.

    For a process that must compute with the model but not see its data (a TARP study's
    workers, which simulate their data sets).  ``RecordModel(*without_records(model, structure))``
    has the model's parameter space, log prior and per-record log-likelihood of any batch, and
    simulates as the model does.  Compile the copy with the structure returned, not with
    :func:`dpppl.model.record_model`: finding the records again in a one-record model can mistake another
    array of length 1 for a record.

    Kept: the free variables (in the model's order, with their priors, transforms, dims and
    initial values), the observed variables, the potentials, the ``pm.Data`` they read, and the
    coordinates of every dimension but the record dimension.  Non-record arrays (``pm.Data`` or
    numpy arrays that are not indexed by records, like prior scales) are public model structure
    and stay as they are.

    Replaced or dropped: every record array of ``structure`` (observed values, record ``pm.Data``
    and numpy covariates) becomes a shared variable holding zeros of its dtype and trailing
    shape, with one record; the record dimension's length becomes 1 and its coordinates are
    dropped (they may come from the data, e.g. a DataFrame index).  Deterministics, and
    ``pm.Data`` that no free variable, likelihood or potential reads, are dropped: they only
    name quantities for the posterior, and may read per-record arrays that are not records of
    the likelihood.  The copy's record model therefore constrains only the free variables.

    Parameters
    ----------
    model
        The PyMC model.
    structure
        Its records, from :func:`find_records`.

    Returns
    -------
    tuple of pymc.Model and RecordStructure
        The copy, and its structure: the same names, dims and shapes, with the copy's variables
        and one record.

    Notes
    -----
    Initial values travel as numbers (an expression is evaluated): like the priors, they are
    model structure, so they must not be derived from the private data.
    """
    fgraph, memo = fgraph_from_model(_without_initial_values(model))

    def in_fgraph(variable: Variable) -> Variable:
        copied = memo.get(variable, variable)
        # Named variables come back wrapped in PyMC's marker Op; the graph reads what is inside.
        if copied.owner is not None and isinstance(copied.owner.op, ModelVar):
            return copied.owner.inputs[0]
        return copied

    placeholders = {
        v.name: _placeholder(v.variable, v.name, np.zeros((1, *v.trailing_shape), dtype=v.dtype))
        for v in structure.variables
    }
    replacements = {in_fgraph(v.variable): placeholders[v.name] for v in structure.variables}
    dim_length = None
    if structure.dim_length is not None:
        dim_length = _placeholder(
            structure.dim_length, structure.dim, np.array(1, dtype=structure.dim_length.dtype)
        )
        replacements[in_fgraph(structure.dim_length)] = dim_length

    core = [
        out
        for out in fgraph.outputs
        if isinstance(out.owner.op, ModelFreeRV | ModelObservedRV | ModelPotential)
    ]
    used = set(ancestors(core))
    named_data = [
        out
        for out in fgraph.outputs
        if isinstance(out.owner.op, ModelNamed) and out.owner.inputs[0] in used
    ]
    # Rebuilt, not type-checked: the graph's static shapes say N where the placeholders hold 1.
    outputs = clone_replace(core + named_data, replacements, rebuild_strict=False)
    copied_graph = FunctionGraph(outputs=outputs, clone=False)
    copied_graph._coords = dict(fgraph._coords)
    copied_graph._dim_lengths = dict(fgraph._dim_lengths)
    if structure.dim is not None:
        copied_graph._coords[structure.dim] = None
        copied_graph._dim_lengths[structure.dim] = dim_length
    copy = model_from_fgraph(copied_graph, mutate_fgraph=True)

    # model_from_fgraph registers variables in topological order; θ's layout follows free_RVs.
    position = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    copy.free_RVs.sort(key=lambda rv: position[rv.name])
    for rv in copy.observed_RVs:
        # PyMC keeps the observed data in the variable's tag too, and cloning a node copies its
        # tag: without this the copy could still hold the original observations.
        rv.tag.observations = copy.rvs_to_values[rv]
    for rv, value in model.rvs_to_initial_values.items():
        # PyMC refuses initial values that depend on random variables, so an expression is one
        # of constants and pm.Data: its value is what the model's initial point uses.
        if isinstance(value, Variable):
            value = value.eval()
        if value is not None:
            copy.set_initval(copy[rv.name], value)

    copied_structure = RecordStructure(
        dim=structure.dim,
        n_records=1,
        variables=tuple(
            RecordVariable(v.name, placeholders[v.name], v.trailing_shape, v.dtype)
            for v in structure.variables
        ),
        observed=tuple(copy[rv.name] for rv in structure.observed),
        record_potentials=tuple(copy[p.name] for p in structure.record_potentials),
        prior_potentials=tuple(copy[p.name] for p in structure.prior_potentials),
        dim_length=dim_length,
    )
    return copy, copied_structure


def _without_initial_values(model: pm.Model) -> pm.Model:
    """A shallow view of ``model`` without its initial values, which ``fgraph_from_model``
    refuses; :func:`without_records` sets them on the copy by name.  The model is not changed."""
    view = object.__new__(type(model))
    view.__dict__.update(model.__dict__)
    view.rvs_to_initial_values = dict.fromkeys(model.rvs_to_initial_values)
    return view


def _placeholder(variable: Variable, name: str, value: np.ndarray) -> Variable:
    """``value`` in a shared variable named ``name`` that can stand in for ``variable``: no
    static length, as a record array has.  Shared even where ``variable`` is a constant (a numpy
    array): PyMC's rewrites merge equal constants, and placeholders are all zeros, so two constant
    placeholders could become one input and the record model would feed both from one array."""
    shape = (None, *variable.type.shape[1:]) if value.ndim else ()
    return pytensor.shared(value, name=name, shape=shape)
