"""``negotiate replay --text`` (tui/commands.py, tui/transcript.py): one episode or every one, and what it refuses."""

from __future__ import annotations

import orjson
import pytest

from negotiate.cli import main
from negotiate.trace import read_episodes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three greedy episodes on the train split (serve's seeds: the markets are 2x2, 3x2 and 4x3)."""
    out = tmp_path_factory.mktemp("replay") / "run"
    assert main(["serve", "--seller", "greedy", "--episodes", "3", "--out", str(out), "--quiet"]) == 0
    return out / "greedy.jsonl"


def _heads(text: str) -> list[str]:
    """Each transcript's first line: ``episode ID | ...``."""
    return [line.split(" | ")[0] for line in text.splitlines() if line.startswith("episode ")]


def test_replay_text_prints_one_episode_and_all_prints_every_one_in_file_order(run, capsys):
    """Issue 51, item 11: ``--text`` printed the first episode of 50 and nothing printed them all. ``--all`` prints
    each one, whole and in the file's order, a blank line between two; each is the transcript ``--episode`` prints."""
    assert main(["replay", str(run), "--text"]) == 0
    first = capsys.readouterr().out
    assert _heads(first) == ["episode greedy-000000"]
    assert main(["replay", str(run), "--text", "--all"]) == 0
    every = capsys.readouterr().out
    assert _heads(every) == ["episode greedy-000000", "episode greedy-000001", "episode greedy-000002"]
    alone = []
    for index in range(3):
        assert main(["replay", str(run), "--text", "--episode", f"greedy-{index:06d}"]) == 0
        alone.append(capsys.readouterr().out)
    assert every == "\n".join(alone) and alone[0] == first
    assert every.count("\nEND ") == 3


def test_all_is_refused_in_one_line_where_it_would_mean_nothing(run, capsys):
    for argv, line in ((["--all"], "--all: prints every episode with --text only (the viewer steps through them all: n and p)"),
                       (["--all", "--text", "--episode", "greedy-000001"],
                        "--all: prints every episode, --episode one of them: give one of the two")):
        assert main(["replay", str(run), *argv]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"negotiate replay: error: {line}\n" and captured.out == ""


def test_all_prints_nothing_when_one_episode_cannot_be_scored(run, tmp_path, capsys):
    """What report refuses, replay --text refuses before it prints a line: here the second episode's market lacks its
    buyers' values."""
    episodes = list(read_episodes(run))
    del episodes[1][0]["market"]["buyers"][0]["values"]
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join(orjson.dumps(event) + b"\n" for events in episodes for event in events))
    for command in (["report", str(broken)], ["replay", str(broken), "--text", "--all"]):
        assert main(command) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == f"negotiate {command[0]}: error: {broken}: episode greedy-000001: the market lacks 'values'\n"
    assert main(["replay", str(broken), "--text"]) == 0  # the first episode alone is whole
    assert _heads(capsys.readouterr().out) == ["episode greedy-000000"]
