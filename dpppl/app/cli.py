"""The ``dpppl`` command: a thin front end on the library.

Subcommands: ``demo``, ``fit``, ``report``, ``accountant``, ``plugins`` (``dpppl --help``).
Results go to stdout, progress and notes to stderr; ``--json`` makes stdout one JSON document.

PyMC, JAX and ArviZ are imported by the subcommands that use them, so that ``--help``,
``plugins`` and the argument checks answer at once.

Exit codes: 0 success; 1 the run was refused or failed (dpppl refused the model, the data, the
privacy setting or the budget; a model, data or result file is broken); 2 the command line is
wrong (unknown subcommand or flag, a missing input file, a value out of range such as ε ≤ 0,
an unknown mechanism, accountant or mechanism option); 130 interrupted.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpppl.app.demo import DEMO_OPTIONS, DEMO_SIMULATIONS, SMOKE_NUTS_SETTINGS, SMOKE_OPTIONS
from dpppl.app.model_file import EXAMPLE_MODEL_FILE
from dpppl.errors import DPPPLError, PluginNotFoundError
from dpppl.plugin.mechanism import Mechanism
from dpppl.plugin.registry import accountants, get_accountant, get_mechanism, mechanisms, registry
from dpppl.privacy.events import NeighbourRelation, PrivacyEvent, poisson_subsampled_gaussian
from dpppl.version import __version__

if TYPE_CHECKING:
    import xarray as xr

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_EPILOG = """\
exit codes:
  0    success
  1    the run was refused or failed: dpppl refused the model, data, privacy setting or
       budget, or a model, data or result file is broken (the message says what to change)
  2    the command line is wrong: unknown flag, missing input file, a value out of range
       (epsilon <= 0, delta outside (0, 1)), unknown mechanism, accountant or option
  130  interrupted
"""

_FIT_DESCRIPTION = """\
Fit a PyMC model to a CSV data set under differential privacy and save the result as netCDF.

MODEL.py must define

    def build_model(data: pandas.DataFrame) -> pymc.Model

where data is DATA.csv read by pandas.read_csv (header line; empty fields and NA are missing).
The model holds the records as observed variables and pm.Data covariates that share a leading
record dimension (name it with dims, or pass --records). Example MODEL.py:

{example}
Mechanism options are passed with --option NAME=VALUE (repeatable); VALUE is read as JSON or a
Python literal (2000, 0.1, true, "nuts"), else as a string. `dpppl plugins` lists the
mechanisms and accountants installed. Errors raised by MODEL.py are reported by type and line
only, since their messages can quote data values.
"""


class UsageError(Exception):
    """The command line is wrong; reported with the subcommand's usage and exit code 2."""


@dataclass
class Answer:
    """What a subcommand found, in the three forms the command prints.

    Attributes
    ----------
    data
        For ``--json``: JSON-compatible.
    text
        For people: the lines printed by default.
    brief
        For ``--quiet``: only the answer (paths written, a number, names).
    """

    data: dict[str, Any]
    text: list[str]
    brief: list[str]


# -- argument types -------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def _probability(text: str) -> float:
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


def _rate(text: str) -> float:
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _simulations(text: str) -> int:
    if text.strip() == "0":
        return 0
    value = _count(text)
    if value == 1:
        raise argparse.ArgumentTypeError("must be 0 (no check) or at least 2")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text}") from None


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def _option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE read as JSON, else a Python literal, else a string."""
    name, separator, raw = text.partition("=")
    if not separator or not name.strip():
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE, got {text}")
    try:
        value = json.loads(raw)
    except ValueError:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
    return name.strip(), value


# -- the parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``dpppl`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="dpppl",
        description="Differentially private probabilistic programming on PyMC.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpppl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars or tables; only the answer"
    )
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")

    def command(
        name: str, handler: Callable, summary: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=summary,
            description=description or summary,
            parents=[common],
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler, parser=sub)
        return sub

    demo = command(
        "demo",
        _demo,
        "fit the bundled example: a private posterior on 2000 rows of UCI Adult",
        description=textwrap.dedent(
            """\
            Fit a Bayesian logistic regression of income > 50K on the 2000-row sample of UCI
            Adult that ships with dpppl (CC BY 4.0, Becker & Kohavi 1996) with NA-DPVI at
            epsilon = 1; show its noise-aware posterior beside the naive one (the last DP-SGD
            iterate of the same release) and beside PyMC's NUTS posterior, which is not private
            and allowed here only because the sample is public; write the result (netCDF) and a
            report (HTML) to --out-dir. About a minute on two cores.
            """
        ),
    )
    demo.add_argument(
        "--out-dir",
        type=Path,
        default=Path("dpppl-demo"),
        metavar="DIR",
        help="where to write (default: %(default)s)",
    )
    demo.add_argument(
        "--steps", type=_count, metavar="T", help="DP-SGD steps (default: na-dpvi's own)"
    )
    demo.add_argument(
        "--coverage-simulations",
        type=_simulations,
        default=DEMO_SIMULATIONS,
        metavar="K",
        help="simulated data sets of the TARP check; 0 skips it (default: %(default)s)",
    )
    demo.add_argument(
        "--epsilon", type=_positive_float, default=1.0, metavar="E", help="default: %(default)s"
    )
    demo.add_argument(
        "--delta", type=_probability, default=1e-5, metavar="D", help="default: %(default)s"
    )
    demo.add_argument(
        "--seed", type=int, metavar="N", help="fix the random seed (reproducible, not private)"
    )
    demo.add_argument(
        "--smoke", action="store_true", help="a seconds-long run for tests: not worth reading"
    )

    fit = command(
        "fit",
        _fit,
        "fit MODEL.py to DATA.csv under differential privacy",
        description=_FIT_DESCRIPTION.format(example=textwrap.indent(EXAMPLE_MODEL_FILE, "    ")),
    )
    fit.add_argument(
        "model", type=_existing_file, metavar="MODEL.py", help="defines build_model(data)"
    )
    fit.add_argument(
        "--data", type=_existing_file, required=True, metavar="DATA.csv", help="the records"
    )
    fit.add_argument("--mechanism", required=True, metavar="NAME", help="e.g. na-dpvi")
    fit.add_argument(
        "--epsilon", type=_positive_float, required=True, metavar="E", help="epsilon > 0"
    )
    fit.add_argument(
        "--delta", type=_probability, required=True, metavar="D", help="well below 1/N"
    )
    fit.add_argument(
        "--out", type=Path, required=True, metavar="RESULT.nc", help="the result (netCDF)"
    )
    fit.add_argument("--accountant", metavar="NAME", help="default: the mechanism's preferred one")
    fit.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a mechanism option, e.g. --option steps=2000 (repeatable)",
    )
    fit.add_argument("--records", metavar="DIM", help="the record dimension, if not found")
    fit.add_argument(
        "--seed", type=int, metavar="N", help="fix the random seed (reproducible, not private)"
    )
    fit.add_argument("--report", type=Path, metavar="REPORT.html", help="also write a report")

    report = command(
        "report", _report, "summary, privacy statement and an HTML report of a saved result"
    )
    report.add_argument(
        "result", type=_existing_file, metavar="RESULT.nc", help="written by dpppl fit or demo"
    )
    report.add_argument(
        "--out", type=Path, metavar="REPORT.html", help="default: RESULT.nc with suffix .html"
    )

    accountant = command(
        "accountant",
        _accountant,
        "noise multiplier for a target epsilon, or epsilon for a noise multiplier",
        description=textwrap.dedent(
            """\
            For DP-SGD (T steps of the Poisson-subsampled Gaussian mechanism with sampling rate
            Q): the noise multiplier sigma that meets (epsilon, delta), or the epsilon at delta
            of a given sigma, by an installed accountant (`dpppl plugins` lists them).
            """
        ),
    )
    target = accountant.add_mutually_exclusive_group(required=True)
    target.add_argument("--epsilon", type=_positive_float, metavar="E", help="target epsilon")
    target.add_argument(
        "--noise-multiplier", type=_positive_float, metavar="SIGMA", help="sigma to account"
    )
    accountant.add_argument("--delta", type=_probability, required=True, metavar="D")
    accountant.add_argument(
        "--sampling-rate", type=_rate, required=True, metavar="Q", help="Poisson inclusion rate"
    )
    accountant.add_argument(
        "--steps", type=_count, required=True, metavar="T", help="number of noisy steps"
    )
    accountant.add_argument(
        "--accountant",
        metavar="NAME",
        help="default: the first installed of " + ", ".join(Mechanism.preferred_accountants),
    )
    accountant.add_argument(
        "--relation",
        choices=("add_or_remove_one", "replace_one"),
        default="add_or_remove_one",
        help="neighbouring data sets (default: %(default)s)",
    )

    command("plugins", _plugins, "installed mechanisms and accountants, with their versions")
    return parser


# -- subcommands ----------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> Answer:
    from arviz_base import rcParams

    from dpppl.app.demo import LEGEND, NON_PRIVATE, coverage_of, run_demo
    from dpppl.app.report import comparison_table

    options = dict(SMOKE_OPTIONS if args.smoke else DEMO_OPTIONS)
    if args.steps is not None:
        options["steps"] = args.steps
    _note(
        args, "dpppl demo: Bayesian logistic regression of income > 50K on 2000 rows of UCI Adult"
    )
    _note(
        args,
        f"na-dpvi at epsilon = {args.epsilon:g}, delta = {args.delta:g}, options: {options}; "
        "then PyMC NUTS without privacy, to compare (the sample is public)",
    )
    if args.coverage_simulations:
        _note(
            args, f"then a TARP coverage check on {args.coverage_simulations} simulated data sets"
        )
    demo = run_demo(
        epsilon=args.epsilon,
        delta=args.delta,
        options=options,
        nuts=SMOKE_NUTS_SETTINGS if args.smoke else None,
        n_simulations=args.coverage_simulations,
        # The smoke run's few tiny fits are quicker here than in freshly started processes.
        n_workers=1 if args.smoke else None,
        random_seed=args.seed,
        progressbar=_progress(args),
    )
    notes = list(demo.notes)
    if args.smoke:
        notes.insert(0, "SMOKE RUN for tests: too few steps and a naive posterior; do not read it.")
    table = comparison_table(demo.comparison)
    inside = coverage_of(demo.comparison, NON_PRIVATE)
    why = [
        "Why noise-aware: the private posteriors beside the non-private one "
        f"(mean [{rcParams['stats.ci_prob']:.0%} interval]):",
        table.to_string(),
        *textwrap.wrap(LEGEND, width=100, initial_indent="  ", subsequent_indent="  "),
        *(
            f"  {label}: its intervals hold the non-private mean for {hits} of {total} parameters"
            for label, (hits, total) in inside.items()
        ),
    ]
    answer = _save(
        demo.result,
        args.out_dir / "result.nc",
        args.out_dir / "report.html",
        notes,
        coverage_heading="Coverage (TARP), a check too small for a verdict:",
        comparison=demo.comparison,
        extra_text=why,
    )
    answer.data["comparison"] = {
        "table": json.loads(table.to_json(orient="index")),
        "intervals_holding_the_non_private_mean": {
            label: {"parameters": hits, "of": total} for label, (hits, total) in inside.items()
        },
    }
    return answer


def _fit(args: argparse.Namespace) -> Answer:
    from dpppl.app.model_file import build_model_from_files
    from dpppl.sampling import sample

    options = dict(args.option)
    _check_plugins(args.mechanism, args.accountant, options)
    model = build_model_from_files(args.model, args.data)
    _note(args, f"fitting {args.mechanism} at epsilon = {args.epsilon:g}, delta = {args.delta:g}")
    result = sample(
        model,
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        delta=args.delta,
        records=args.records,
        accountant=args.accountant,
        random_seed=args.seed,
        progressbar=_progress(args),
        **options,
    )
    notes = [f"Fitted with `dpppl fit {args.model.name} --data {args.data.name}`."]
    return _save(result, args.out, args.report, notes)


def _report(args: argparse.Namespace) -> Answer:
    from dpppl.app.report import read_result, write_report

    result = read_result(args.result)
    path = write_report(result, args.out or args.result.with_suffix(".html"))
    return _outcome(result, {"result": args.result, "report": path})


def _accountant(args: argparse.Namespace) -> Answer:
    name = args.accountant or next(
        (n for n in Mechanism.preferred_accountants if n in registry().accountants), None
    )
    if name is None:
        raise UsageError(
            f"none of the accountants {list(Mechanism.preferred_accountants)} is installed"
        )
    _check_plugins(None, name, {})
    accountant = get_accountant(name)()
    relation = NeighbourRelation(args.relation)

    def event_for(sigma: float) -> PrivacyEvent:
        return poisson_subsampled_gaussian(sigma, args.sampling_rate, args.steps)

    sigma = args.noise_multiplier
    if sigma is None:
        sigma = accountant.noise_multiplier(
            event_for, epsilon=args.epsilon, delta=args.delta, relation=relation
        )
    epsilon = accountant.epsilon(event_for(sigma), delta=args.delta, relation=relation)
    data = {
        "accountant": name,
        "noise_multiplier": sigma,
        "epsilon": epsilon,
        "delta": args.delta,
        "sampling_rate": args.sampling_rate,
        "steps": args.steps,
        "relation": relation.value,
    }
    text = (
        f"noise multiplier sigma = {sigma:.6g}: epsilon = {epsilon:.6g} at delta = {args.delta:g} "
        f"({name} accountant), for {args.steps} steps of the Poisson-subsampled Gaussian "
        f"mechanism with sampling rate {args.sampling_rate:g}, "
        f"{relation.value.replace('_', '-')} neighbours"
    )
    brief = f"{sigma:.6g}" if args.noise_multiplier is None else f"{epsilon:.6g}"
    return Answer(data, [text], [brief])


def _plugins(args: argparse.Namespace) -> Answer:
    listing = {"mechanisms": mechanisms(), "accountants": accountants()}
    text = []
    for heading, installed in listing.items():
        text.append(f"{heading}:")
        rows = list(installed.values())
        providers = [f"{row.distribution} {row.version}" for row in rows]
        name_width = max((len(row.name) for row in rows), default=0)
        provider_width = max(map(len, providers), default=0)
        for row, by in zip(rows, providers, strict=True):
            text.append(f"  {row.name:<{name_width}}  {by:<{provider_width}}  {row.description}")
            if row.options:
                options = ", ".join(f"{name}={value!r}" for name, value in row.options.items())
                text += textwrap.wrap(
                    f"options: {options}", width=100, initial_indent=" " * (name_width + 4),
                    subsequent_indent=" " * (name_width + 6),
                )
        if not rows:
            text.append("  (none installed)")
    data = {
        heading: [dataclasses.asdict(row) for row in installed.values()]
        for heading, installed in listing.items()
    }
    names = [name for installed in listing.values() for name in installed]
    return Answer(data, text, names)


# -- shared steps ---------------------------------------------------------------------------------


def _check_plugins(mechanism: str | None, accountant: str | None, options: dict[str, Any]) -> None:
    """Refuse unknown plugin names and mechanism options as usage errors, before any work."""
    try:
        if mechanism is not None:
            get_mechanism(mechanism)(**options)
        if accountant is not None:
            get_accountant(accountant)
    except PluginNotFoundError as error:
        raise UsageError(str(error)) from None
    except (TypeError, ValueError) as error:
        raise UsageError(f"bad --option: {error}") from None


def _save(
    result: xr.DataTree,
    path: Path,
    report: Path | None,
    notes: list[str],
    *,
    coverage_heading: str = "Coverage (TARP):",
    comparison: dict[str, xr.DataTree] | None = None,
    extra_text: Sequence[str] = (),
) -> Answer:
    """Write the result (and the report, if asked) and describe them; ``extra_text`` goes
    before the file locations."""
    from dpppl.app.report import write_report, write_result

    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(result, path)
    paths = {"result": path}
    if report is not None:
        paths["report"] = write_report(result, report, notes=notes, comparison=comparison)
    return _outcome(result, paths, coverage_heading=coverage_heading, extra_text=extra_text)


def _outcome(
    result: xr.DataTree,
    paths: dict[str, Path],
    *,
    coverage_heading: str = "Coverage (TARP):",
    extra_text: Sequence[str] = (),
) -> Answer:
    """The summary, the privacy statement, the coverage if any, and where the files are."""
    import arviz as az

    from dpppl.diagnostics import coverage_summary
    from dpppl.results import privacy_statement

    summary = az.summary(result)
    statement = privacy_statement(result)
    located = {kind: str(path.resolve()) for kind, path in paths.items()}
    where = [f"{kind.capitalize() + ':':<8} {path}" for kind, path in located.items()]
    text = ["Posterior summary (ArviZ):", summary.to_string(), "", "Privacy guarantee:", statement]
    if "tarp" in result.children:
        text += ["", coverage_heading, coverage_summary(result["tarp"].to_dataset())]
    if extra_text:
        text += ["", *extra_text]
    data = {
        **located,
        "privacy_statement": statement,
        "privacy": {k: v for k, v in result.attrs.items() if k.startswith("dp_")},
        "summary": json.loads(summary.to_json(orient="index")),
    }
    return Answer(data, [*text, "", *where], where)


# -- output ---------------------------------------------------------------------------------------


def _note(args: argparse.Namespace, text: str) -> None:
    if not (args.quiet or args.json):
        print(text, file=sys.stderr)


def _progress(args: argparse.Namespace) -> bool:
    # Progress bars draw on stdout, which --json keeps for the JSON document.
    return not (args.quiet or args.json)


def _show_warning(message: Warning | str, *_: Any, **__: Any) -> None:
    """Warnings as one line on stderr, without the source line that raised them."""
    print(f"dpppl: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dpppl`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    warnings.filterwarnings("ignore", message="Skipping .* Op .* as JAX tracing would remove it")
    try:
        answer = args.handler(args)
    except UsageError as error:
        args.parser.error(str(error))
    except DPPPLError as error:
        print(f"dpppl {args.command}: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("dpppl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(answer.data, indent=2, default=str))
    else:
        print("\n".join(answer.brief if args.quiet else answer.text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
