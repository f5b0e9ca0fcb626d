"""The public surface: pinned, importable, and one name for one thing (docs/style.md, item 10).

``PUBLIC`` pins what each public package exports. A change to a package's ``__all__`` fails
:func:`test_public_surface_is_pinned` until it is announced here, in the same commit, so the surface
never grows (or shrinks) by accident.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import negotiate
import negotiate.agents.base
import negotiate.training

PUBLIC = {
    "negotiate": [
        "Action", "Buyer", "BuyerObservation", "Episode", "EpisodeState", "Generated", "Market", "MarketSpec", "Message",
        "Notice", "ParseFailure", "Product", "SCHEMA_VERSION", "SPLITS", "SellerObservation", "TraceWriter", "UserError",
        "episode_metrics", "generate", "json_schema", "load_spec", "metrics_from_events", "observe", "opt", "parse",
        "read_episodes", "render_tagged", "run_episode",
    ],
    "negotiate.agents": ["AgentSpec", "BUYERS", "BuyerAgent", "SELLERS", "ScriptedAgent", "SellerAgent", "parse_agent"],
    "negotiate.training": [
        "DEFAULT_REWARD", "DataFilter", "Decision", "METHODS", "PENALTY", "REWARDS", "ScoredEpisode", "TrainConfig", "advantages",
        "decisions", "group_key", "load_episodes", "replay", "reward_fn", "train",
    ],
    "negotiate.tui": [],
}
"""Each public package's ``__all__``, sorted (``negotiate.tui`` exports nothing: its modules are the API)."""


def _surface(package: str) -> list[str]:
    module = importlib.import_module(package)
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    # No __all__: every public attribute that is not a submodule counts.
    return sorted(name for name, value in vars(module).items() if not name.startswith("_") and not isinstance(value, types.ModuleType)
                  and name != "annotations")


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_surface_is_pinned(package):
    found, pinned = _surface(package), sorted(PUBLIC[package])
    added, removed = sorted(set(found) - set(pinned)), sorted(set(pinned) - set(found))
    assert (added, removed) == ([], []), f"{package}.__all__ changed: announce it in PUBLIC (tests/test_public_api.py)"


def _modules() -> list[str]:
    """Every module of the public packages (not __main__, which runs the CLI)."""
    names = []
    for package in PUBLIC:
        names.append(package)
        module = importlib.import_module(package)
        names += [f"{package}.{info.name}" for info in pkgutil.iter_modules(module.__path__) if not info.ispkg and info.name != "__main__"]
    return names


def _is_type(value) -> bool:
    return isinstance(value, (type, types.UnionType, types.GenericAlias))


def test_one_type_name_means_one_type_everywhere():
    # Two different classes (or type aliases) exported under one name read alike in every import and
    # type hint: ``Decision`` was an agent's reply in negotiate.agents.base and a training sample in
    # negotiate.training; ``Episode`` an episode's trace and a scored training episode.
    owners: dict[str, dict[int, list[str]]] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError as error:  # an optional extra (torch, transformers, trl) is missing here
            if error.name and error.name.split(".")[0] in ("torch", "transformers", "trl", "peft", "datasets", "accelerate"):
                continue
            raise
        for exported in getattr(module, "__all__", []):
            value = getattr(module, exported)
            if _is_type(value):
                owners.setdefault(exported, {}).setdefault(id(value), []).append(name)
    assert {name: sorted(sum(by_id.values(), [])) for name, by_id in owners.items() if len(by_id) > 1} == {}


def test_renamed_types_keep_their_old_import_paths():
    # Renamed so that one name means one type; the old paths still import what they did.
    from negotiate.agents.base import ActResult, Decision as AgentDecision
    from negotiate.training import Episode as TrainingEpisode, ScoredEpisode
    from negotiate.training.dataset import Episode as DatasetEpisode

    assert AgentDecision is ActResult and TrainingEpisode is DatasetEpisode is ScoredEpisode
    assert "Episode" not in negotiate.training.__all__ and "Decision" not in negotiate.agents.base.__all__


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
    ["negotiate.market", "negotiate.protocol", "negotiate.rules", "negotiate.regulator", "negotiate.bus", "negotiate.episode",
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
