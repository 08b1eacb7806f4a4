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


def _privacy_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Privacy guarantees and their limits")
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def test_the_privacy_section_states_who_sees_error_messages():
    """Refusing NaN data is a one-bit function of the data that no ε covers."""
    section = _privacy_section()
    assert "error messages go to the data holder only" in section
    assert "one bit" in section


def test_the_privacy_section_says_under_which_relation_n_is_public():
    section = _privacy_section()
    assert "Under replace-one neighbours" in section and "N is public by definition" in section
    assert 'relation="replace_one"' in section
    assert "must not be derived from the private data" in section
    assert "accounts exactly" not in (ROOT / "README.md").read_text()
