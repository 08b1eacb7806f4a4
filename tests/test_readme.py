"""The README's commands are the ones CI runs, and they install every plugin in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.DOTALL)


def ci_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return next(line for line in lines if line.startswith("python3.12 -m venv"))


def test_ci_runs_the_readme_test_command_verbatim():
    assert ci_command() in readme_commands()


def test_the_first_command_sets_up_the_same_way_and_runs_the_demo():
    first = readme_commands()[0]
    setup, _, main_job = first.rpartition(" && ")
    assert main_job == ".venv/bin/dpppl demo"
    assert ci_command().startswith(setup + " && ")


def test_the_set_up_installs_every_plugin_distribution():
    installed = set(re.findall(r"-e (plugins/[\w-]+)", ci_command()))
    present = {
        f"plugins/{path.parent.name}" for path in (ROOT / "plugins").glob("*/pyproject.toml")
    }
    assert installed == present
