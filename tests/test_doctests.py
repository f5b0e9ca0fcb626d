"""The doctests of the metrics and the scripted agents run and pass."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["negotiate.metrics", "negotiate.settings", "negotiate.workers", "negotiate.runner",
                                  "negotiate.training.rewards", "negotiate.training.dataset", "negotiate.training.server",
                                  "negotiate.report", "negotiate.plots", "negotiate.agents.planner", "negotiate.agents.llm",
                                  "negotiate.agents.views.text", "negotiate.agents.views.advice", "negotiate.agents.views.tools",
                                  "negotiate.training.loop", "negotiate.agents.policy", "negotiate.tui.transcript", "negotiate.tui.replay",
                                  "negotiate.training.ranks", "negotiate.agents.rule", "negotiate.trace_schema", "negotiate.trace_read"])
def test_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests failed in {name}"
    if result.attempted == 0:
        pytest.skip(f"{name} has no doctests")


def test_metrics_has_doctests():
    # docs/style.md, item 7: every reward and metric function documents itself with a doctest.
    module = importlib.import_module("negotiate.metrics")
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False).attempted >= 2


def test_every_reward_has_a_doctest():
    from negotiate.training import rewards

    finder = doctest.DocTestFinder()
    for name, fn in rewards.REWARDS.items():
        tests = finder.find(fn, name, globs={})
        assert tests and tests[0].examples, f"reward {name} has no doctest"
