"""The import contract: the engine stands alone.

The engine (protocol, market, rules, regulator, bus, episode, trace, metrics, and errors beneath them) imports
no agents, no training, no TUI and no application layer (cli, runner, workers, report, plots), neither at
the top of a module nor inside a function; importing it loads none of them, nor textual, torch, an HTTP
client or matplotlib. Agents, training and the TUI build on the engine, never the other way round.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import negotiate

ENGINE = ["protocol", "market", "rules", "regulator", "bus", "episode", "trace", "trace_schema", "trace_store", "trace_read",
          "metrics", "errors"]
"""The engine modules, under negotiate/ (``trace`` re-exports ``trace_schema``, ``trace_store`` and ``trace_read``)."""
FORBIDDEN = ["negotiate.agents", "negotiate.training", "negotiate.tui", "negotiate.cli", "negotiate.cli_runs", "negotiate.cli_commands",
             "negotiate.runner", "negotiate.workers", "negotiate.report", "negotiate.plots"]
"""What the engine may not import: the layers above it."""
HEAVY = ["textual", "torch", "transformers", "trl", "peft", "openai", "aiohttp", "httpx", "matplotlib", "vllm"]
"""Third-party packages an engine import must not load (a core install, a fast start)."""

ROOT = Path(negotiate.__file__).resolve().parent


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module an ``import`` statement in ``path`` names (lazy imports inside functions included), absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from .agents import y: relative to the negotiate package
                base = ".".join(["negotiate", *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return sorted(found, key=lambda item: item[0])  # ast.walk goes breadth first; report in file order


def _breaks(name: str) -> bool:
    return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)


def test_imported_finds_lazy_and_relative_imports(tmp_path):
    # The reader itself, on a file worked by hand: a top-level, a lazy and a relative import are all seen.
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from negotiate.agents import llm\n\nfrom .tui import app\n")
    names = [name for _, name in _imported(source)]
    assert names == ["os", "negotiate.agents", "negotiate.agents.llm", "negotiate.tui", "negotiate.tui.app"]
    assert [name for name in names if _breaks(name)] == ["negotiate.agents", "negotiate.agents.llm", "negotiate.tui", "negotiate.tui.app"]


@pytest.mark.parametrize("module", ENGINE)
def test_engine_source_imports_nothing_above_it(module):
    path = ROOT / f"{module}.py"
    assert [f"{path.name}:{line}: {name}" for line, name in _imported(path) if _breaks(name)] == []


def test_importing_the_engine_loads_no_agents_training_tui_or_heavy_packages():
    # A fresh interpreter, so nothing this test session imported before counts.
    code = ("import sys\n"
            + "".join(f"import negotiate.{module}\n" for module in ENGINE)
            + "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "negotiate.episode" in loaded and "negotiate.regulator" in loaded  # the check saw the engine load
    assert [name for name in loaded if _breaks(name)] == []
    assert [name for name in loaded if name.split(".")[0] in HEAVY] == []


PACKAGES = {"negotiate": ROOT, "negotiate.agents": ROOT.parent / "agents", "negotiate.training": ROOT.parent / "training",
            "negotiate.tui": ROOT.parent / "tui"}
"""Where each installed package's source lives (pyproject's package-dir): the checkout's folders."""


def _modules() -> dict[str, Path]:
    """Every module of the project by its import name: ``agents/llm.py`` is ``negotiate.agents.llm``."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join([package, *parts])
            found[name.removesuffix(".__init__")] = path
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, lazy imports included (``from m import name`` is an edge to ``m``,
    or to the submodule ``m.name`` where that is a module)."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imported(path):
            while imported and imported not in modules:  # a name inside a module: the module that holds it
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the import cycles."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_cycles_finds_a_cycle_through_a_lazy_import_and_nothing_in_a_chain():
    # Worked by hand: a -> b -> c -> a (c's import inside a function) is one cycle; d -> a adds none.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_project_has_no_import_cycle_lazy_imports_included():
    # A cycle hides a layer that is not one: the model half (backends, pools, local, llm, registry), the planner and the
    # scripted sellers, and the trainer and online GRPO once made three. A new one fails here, naming its modules.
    modules = _modules()
    assert {"negotiate.agents.llm", "negotiate.agents.registry", "negotiate.training.trainer", "negotiate.tui.app"} <= set(modules)
    graph = _graph(modules)
    assert "negotiate.agents.backends" in graph["negotiate.agents.llm"]  # the reader sees the imports it judges
    assert _cycles(graph) == []


AGENTS_MAY = [*ENGINE, "rollout", "logs"]
"""What ``agents/`` may import of ``negotiate/``: the engine, its exact replays (``rollout``, itself on the engine) and
the log setup (``logs``). Never training, the TUI or the application layer (cli, runner, workers, report, plots)."""


def _agents_break(name: str) -> bool:
    """An import ``agents/`` may not make: a ``negotiate`` module that is neither the agents' own nor one it may use."""
    if name != "negotiate" and not name.startswith("negotiate."):
        return False  # a third-party or standard module
    allowed = ["negotiate.agents", *(f"negotiate.{module}" for module in AGENTS_MAY)]
    return not any(name == ok or name.startswith(ok + ".") for ok in allowed)


def test_the_agents_fence_refuses_what_it_should():
    # Worked by hand: the engine and the agents' own modules pass; training, the TUI, the CLI and the runner do not.
    passing = ["negotiate.protocol", "negotiate.regulator.observe", "negotiate.agents.hf", "negotiate.rollout", "orjson"]
    failing = ["negotiate.training.trainer", "negotiate.tui.app", "negotiate.cli", "negotiate.runner", "negotiate"]
    assert [name for name in passing if _agents_break(name)] == []
    assert [name for name in failing if _agents_break(name)] == failing


def test_agents_source_imports_only_the_engine_and_the_agents():
    # As the engine is fenced: lazy imports inside functions included, so a backend cannot reach up into the runner.
    folder = PACKAGES["negotiate.agents"]
    broken = [f"{path.relative_to(folder).as_posix()}:{line}: {name}" for path in sorted(folder.rglob("*.py"))
              for line, name in _imported(path) if _agents_break(name)]
    assert broken == []


def test_importing_every_agents_module_loads_no_training_tui_or_application_module():
    folder = PACKAGES["negotiate.agents"]
    names = sorted(name for name in _modules() if name.startswith("negotiate.agents"))
    assert {"negotiate.agents.backends", "negotiate.agents.contract", "negotiate.agents.hf"} <= set(names)
    code = "import sys\n" + "".join(f"import {name}\n" for name in names) + "print('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=folder.parent)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "negotiate.agents.backends" in loaded
    # the negotiate package itself is loaded as the agents' parent (its __init__ loads the engine's public names only)
    assert [name for name in loaded if name != "negotiate" and _agents_break(name)] == []
