"""benchmarks/hindsight.py: teacher episodes that send, in each state, the better of the planner's and greedy's messages.

Each label is found by replaying the market, which is exact because scripted buyers are seeded: checked here by playing
both branches of every labelled state again, apart from the script. The episode it writes is one a model under
``prompt=tools`` can learn from: each of its messages is one of the two the prompt shows.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from negotiate.trace import read_records
from negotiate.training.dataset import load_episodes

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("hindsight", ROOT / "benchmarks" / "hindsight.py")
hindsight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hindsight)

COMPACT = str(ROOT / "specs" / "compact.toml")


def played(episode) -> list[dict]:
    """An episode's events without their clock readings."""
    return [{k: v for k, v in e.items() if k not in ("ts", "time", "wall_s")} for e in episode.events if e.type != "episode_end"]


def market(index: int) -> hindsight.Market:
    return hindsight.Market(COMPACT, "concession", 7, index)


@pytest.mark.parametrize("ties", ["greedy", "planner"])
async def test_each_label_is_the_move_that_did_better_and_the_episode_never_does_worse_than_the_planner(ties):
    gains = []
    for index in range(6):
        done = await hindsight.label(market(index), ties, defaultdict(list))
        assert done.switch, index  # the tools disagree somewhere in every one of these markets
        # Policy improvement: each label keeps the better branch, and the first branch is the planner's own episode.
        final = hindsight.ratio(done.episode)
        assert final >= done.planner_ratio - 1e-12
        gains.append(final - done.planner_ratio)
        for step, chose_greedy in done.switch.items():
            prefix = {k: v for k, v in done.switch.items() if k < step}
            greedy = hindsight.ratio((await market(index).play(switch={**prefix, step: True}))[0])
            planner = hindsight.ratio((await market(index).play(switch={**prefix, step: False}))[0])
            assert chose_greedy == (greedy > planner or (greedy == planner and ties == "greedy")), (index, step)
        # The written episode is the replay of its own labels.
        again, _ = await market(index).play(switch=done.switch)
        assert played(again) == played(done.episode)
    assert max(gains) > 0  # on these markets some label beat the planner's move


async def test_a_replay_is_exact_so_a_label_is_a_fact_of_the_market():
    first, seller = await market(3).play(switch={})
    second, _ = await market(3).play(switch={})
    assert played(first) == played(second) and first.metrics["profit"] == second.metrics["profit"]
    assert seller.states and all(len(kind.split("/")) == 5 for _, kind in seller.states)  # state_of's five parts


def test_the_trace_teaches_the_tools_prompt_and_the_summary_says_what_it_holds(tmp_path, capsys):
    out = tmp_path / "hs"
    hindsight.cli(["--out", str(out), "--splits", COMPACT, "--markets", "4", "--check", "2"])
    printed = capsys.readouterr().out
    summary = json.loads((out / "hindsight.json").read_text())
    assert summary["episodes"] == 4 and 0 < summary["greedy_labels"] <= summary["labelled_states"]
    assert summary["profit_ratio"] >= summary["planner_profit_ratio"]
    assert "4 episodes" in printed and "paired against the planner" in printed
    records = list(read_records(out / "hindsight.jsonl"))
    assert len(records) == 4 and {r.start.seller for r in records} == {"hindsight"}
    made = [d for ep in load_episodes([out], prompt="tools") for d in ep.decisions]
    assert made
    for decision in made:  # every message is the move of one of the prompt's two lines
        prompt = decision.prompt[1]["content"]
        advice = re.search(r"^Advice: (.*?)(?: \(.*\))?$", prompt, re.M).group(1)
        greedy = re.search(r"^Greedy: (.*)$", prompt, re.M).group(1)
        to = decision.completion.split("To: ", 1)[1].split("\n", 1)[0]
        move = f"to {to}, {decision.completion.rsplit('Action: ', 1)[1]}"
        assert move in (advice, greedy), (prompt, decision.completion)


def test_the_held_out_seed_and_a_used_folder_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="--seed: 1000003: is the held-out run seed"):
        hindsight.cli(["--out", str(tmp_path / "a"), "--seed", "1000003", "--markets", "1"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "hindsight.jsonl").write_text("")
    with pytest.raises(SystemExit, match="already holds a trace"):
        hindsight.cli(["--out", str(tmp_path / "b"), "--markets", "1"])


async def test_tool_choices_counts_the_hindsight_labels_as_the_tools_it_sent(tmp_path):
    """``tool_choices`` walks both tools over a trace on its own; on hindsight episodes it finds greedy's message sent
    exactly where a label chose it, and the planner's in the other labelled states (or where greedy would wait)."""
    from negotiate.trace import TraceWriter
    from negotiate.training.dataset import tool_choices

    labels = chosen = 0
    with TraceWriter(tmp_path / "t.jsonl") as writer:
        for index in range(4):
            done = await hindsight.label(market(index), "greedy", defaultdict(list))
            writer.write(done.episode.events)
            labels, chosen = labels + len(done.switch), chosen + sum(done.switch.values())
    (counts,) = tool_choices([tmp_path]).values()
    greedy = sum(n for key, n in counts.items() if key[0] == "greedy")
    planner = sum(n for key, n in counts.items() if key[0] == "planner")
    assert greedy == chosen and planner >= labels - chosen and counts["neither"] == counts["invalid"] == 0
    assert planner - (labels - chosen) == counts[("planner", "wait")]  # no label where greedy would wait


async def test_a_table_played_as_a_rule_seller_plays_as_the_scripts_table_chooser(tmp_path):
    """The lookup table as a seller (``rule?...&table=FILE``, what the loop plays beside the fixed rules) sends, in every
    state, what the script's own table seller sends: the same messages, episode for episode."""
    from negotiate.agents.registry import parse_agent
    from negotiate.episode import run_episode
    from negotiate.run import seller_seed
    from negotiate.runner import build_episode

    def messages(episode) -> list[tuple]:
        return [(e.sender, str(e.to), e.action, e.valid) for e in episode.events if e.type == "message"]

    flipped = 0
    for index in range(6):
        _, seller = await market(index).play()
        kinds = sorted({kind for _, kind in seller.states})
        table = {kind: k % 2 == 0 for k, kind in enumerate(kinds)}  # greedy's move in every other kind of state seen
        file = tmp_path / f"table-{index}.json"
        file.write_text(json.dumps({kind: "greedy" if pick else "planner" for kind, pick in table.items()}))
        theirs, _ = await market(index).play(table=table)
        spec = parse_agent(f"rule?tools=planner?reasons=1|greedy&table={file}", "seller")
        m, _, buyers = build_episode(market(index).spec, spec, market(index).buyers, 7, index)
        ours = await run_episode(m, spec.build(m, seller_seed(m.seed)), buyers, fresh=True, episode_id="x")
        assert messages(ours) == messages(theirs), index
        flipped += messages(theirs) != messages((await market(index).play())[0])
    assert flipped >= 3  # the tables changed what was sent: not the planner's episodes over again


def test_a_bad_table_is_one_line_naming_the_file(tmp_path):
    from negotiate.agents.registry import parse_agent
    from negotiate.errors import UserError

    (tmp_path / "t.json").write_text('{"hold out/reject/accept/same/4": "oracle"}')
    for text, message in [(tmp_path / "nope.json", "cannot read it"), (tmp_path / "t.json", "names 'oracle', not one of the tools")]:
        with pytest.raises(UserError, match=re.escape(str(text)) + ".*" + message):
            parse_agent(f"rule?tools=planner?reasons=1|greedy&table={text}", "seller")


def test_an_evaluation_over_several_splits_is_training_data_and_a_folder_twice_is_refused(tmp_path):
    """An eval's splits number their episodes alike (``greedy-000000`` on each): they are different episodes, and an SFT
    may learn from all of them; the same folder given twice is still refused."""
    from negotiate.cli import main
    from negotiate.errors import UserError

    assert main(["eval", "--seller", "greedy", "--split", "train,shapes", "--episodes", "3", "--out", str(tmp_path / "e"),
                 "--quiet"]) == 0
    loaded = load_episodes([tmp_path / "e"])
    assert len(loaded) == 6 and len({(ep.record.start.split, ep.record.id) for ep in loaded}) == 6
    assert main(["serve", "--seller", "greedy", "--episodes", "2", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "greedy.jsonl").write_bytes((tmp_path / "s" / "greedy.jsonl").read_bytes())
    with pytest.raises(UserError, match="the same episode appears twice"):
        load_episodes([tmp_path / "s", copy])
