"""What the repository cites is in the repository: the docs a module or test names exist, notes kept elsewhere are
brought into docs/; one way to matplotlib; no run output tracked."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [path for folder in ("negotiate", "agents", "training", "tui", "tests", "benchmarks", "specs")
           for path in sorted((ROOT / folder).rglob("*.py"))]


def test_every_doc_the_code_cites_is_in_the_repository():
    """The pages of docs/ (a study's write-up under docs/experiments/ comes with its study)."""
    cited = {(path.relative_to(ROOT).as_posix(), doc) for path in SOURCES
             for doc in re.findall(r"\bdocs/[\w.-]+\.md\b", path.read_text(encoding="utf-8"))}
    assert cited and [(path, doc) for path, doc in cited if not (ROOT / doc).is_file()] == []
    assert {"docs/engineering-notes.md", "docs/style.md"} <= {doc for _, doc in cited}


def test_no_code_cites_notes_kept_outside_the_repository():
    """NOTES.md, shared/NOTES.md and STYLE.md are not in the repository: what the code needs of them is in docs/."""
    citing = {path.relative_to(ROOT).as_posix() for path in SOURCES if path.name != "test_docs.py"
              and re.search(r"(?<![\w/-])(?:shared/)?(?:NOTES|STYLE)\.md", path.read_text(encoding="utf-8"))}
    assert citing == set(), citing


def test_pyplot_is_had_one_way():
    """Every plot (evaluation, training curve, loop curve) gets pyplot from negotiate.plots.pyplot (Agg, files only)."""
    importing = [path.relative_to(ROOT).as_posix() for path in SOURCES if path.parent.name != "tests"
                 and re.search(r"^\s*(import matplotlib|from matplotlib)", path.read_text(encoding="utf-8"), re.M)]
    assert importing == ["negotiate/plots.py"]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_run_output_is_tracked():
    """checkpoints/ is ignored; a training log tracked before the rule was removed from the index."""
    tracked = subprocess.run(["git", "ls-files", "checkpoints", "runs", "traces"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert [path for path in tracked if not path.endswith("README.md")] == []
