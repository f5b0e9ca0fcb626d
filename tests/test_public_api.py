"""The public surface: every name in ``negotiate.__all__`` is importable (STYLE.md, item 10)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import negotiate


def _public_names() -> list[str]:
    init = Path(negotiate.__path__[0]) / "__init__.py"
    if not init.exists() or not hasattr(negotiate, "__all__"):
        pytest.skip("negotiate/__init__.py does not define __all__")
    return list(negotiate.__all__)


def test_every_name_in_all_is_importable():
    names = _public_names()
    assert names, "__all__ is empty"
    assert len(names) == len(set(names)), "__all__ lists a name twice"
    module = importlib.import_module("negotiate")
    missing = [name for name in names if not hasattr(module, name)]
    assert missing == []
    for name in names:
        exec(f"from negotiate import {name}", {})


def test_all_names_are_public():
    assert [name for name in _public_names() if name.startswith("_")] == []


@pytest.mark.parametrize(
    "module",
    ["negotiate.market", "negotiate.protocol", "negotiate.regulator", "negotiate.bus", "negotiate.episode",
     "negotiate.metrics", "negotiate.trace", "negotiate.report", "negotiate.cli",
     "negotiate.agents", "negotiate.agents.scripted", "negotiate.agents.registry", "negotiate.agents.base",
     "negotiate.runner", "negotiate.logs", "negotiate.report", "negotiate.plots",
     "negotiate.agents.human", "negotiate.tui.session", "negotiate.tui.transcript", "negotiate.tui.commands",
     "negotiate.agents.llm", "negotiate.agents.backends",
     "negotiate.training", "negotiate.training.rewards", "negotiate.training.dataset", "negotiate.training.options"],
)
def test_module_all_names_exist(module):
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    if names is None:
        pytest.skip(f"{module} has no __all__")
    assert [name for name in names if not hasattr(mod, name)] == []
    exec(f"from {module} import *", {})


def test_no_top_level_agents_package_is_installed(tmp_path):
    # DESIGN.md: `agents` is a popular SDK's import name; the install maps only negotiate.agents.
    # Run from an empty folder, so the checkout's own agents/ folder is not on sys.path.
    import subprocess
    import sys

    code = ("import importlib.util, negotiate.agents, negotiate.training; "
            "print(importlib.util.find_spec('agents') is None, importlib.util.find_spec('training') is None, "
            "negotiate.agents.__name__, negotiate.training.__name__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "negotiate.agents", "negotiate.training"]


def test_the_train_package_imports_without_torch():
    # The core install has no torch: rewards, the dataset and the train command's flags must load without it.
    import subprocess
    import sys

    code = ("import sys, negotiate.training, negotiate.training.options, negotiate.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'trl') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"
