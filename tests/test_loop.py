"""``negotiate loop``'s bookkeeping, with its stages stood in for: resuming where it was cut, refusing a
changed run, one-line failures, the results table paired on the same markets.

The stand-in runs every serve/collect/eval stage for real, in this process, with a scripted
seller in place of the served policy (``random``, seeded per episode, plays "the policy", so a
group's rewards differ), and writes a fake checkpoint for each training stage. The real loop on vLLM is in tests/test_vllm.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.trace import read_records, trace_files
from negotiate.training import loop
from negotiate.settings import read_command, read_file, to_toml
from negotiate.training.loop import EVAL_FIELDS, SFT_FIELDS, LoopConfig, LoopError, results_table, run_loop
from negotiate.training.trainer import TrainConfig

SPEC = 'split = "train"\nname = "tiny"\nbuyers = 2\nproducts = 2\n'


def _as_flags(args: list[str]) -> list[str]:
    """A play stage's command (``eval --config FILE --out DIR``) with the file's settings as the flags they are (every
    key is a flag: ``--keys``), so that a test reads the seller, the split and the rest off the command line."""
    assert args[0] in ("serve", "collect", "eval") and "--config" in args, args
    i = args.index("--config")
    flags = []
    for key, value in tomllib.loads(Path(args[i + 1]).read_text()).items():
        if value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value is not False:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return [args[0], *flags, *args[1:i], *args[i + 2:]]


@pytest.fixture
def world(monkeypatch, tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text(SPEC)
    calls: list[str] = []
    crash = {"at": None, "policy": "random", "train_args": [], "args": {}}

    def run_stage(name, args, out_file, *, tolerate_failed_episodes=True, progress=None, echo=None):
        calls.append(name)
        if progress is not None:  # what the loop shows while a stage runs: said before it has begun, too
            progress()
        crash["args"][name] = _as_flags(args) if args[0] != "train" else args
        if args[0] == "train":  # the stage runs `train --config FILE`: the typed config, as the child reads it
            assert args[1] == "--config" and Path(args[2]).name == "train.toml"
            train = TrainConfig(**read_file(args[2], TrainConfig, command="train"))
            crash["train_args"].append(train)
            out = Path(train.out)
            out.mkdir(parents=True)
            (out / "metrics.jsonl").write_text("{}\n")
        if name == crash["at"]:
            raise KeyboardInterrupt  # the loop killed in the middle of this stage
        if args[0] == "train":
            (out / "adapter").mkdir()
            (out / "adapter" / "adapter_config.json").write_text("{}")
            (out / "train.json").write_text("{}")
            return 1.0
        # the command as the loop wrote it, its file's model policy played by a scripted seller
        policy, i = crash["policy"], args.index("--config")
        settings = tomllib.loads(Path(args[i + 1]).read_text())
        settings["seller"] = ",".join(policy if s.startswith("openai:") else s for s in settings["seller"].split(","))
        file = Path(args[i + 1]).with_suffix(".stand-in.toml")
        file.write_text(to_toml(settings))
        assert main([*args[:i + 1], str(file), *args[i + 2:]]) == 0, args
        return 1.0

    monkeypatch.setattr(loop.stages, "run_stage", run_stage)
    monkeypatch.setattr(loop.Serving, "policy", lambda self, r: ("http://127.0.0.1:9/v1", "base" if r is None else f"round-{r}"))
    monkeypatch.setattr(loop.Serving, "stop", lambda self: None)

    def decide(self):
        self.state.data["serving"] = {"mode": "merged", "why": "test"}

    monkeypatch.setattr(loop.Serving, "decide", decide)
    import negotiate.training.trainer as trainer

    monkeypatch.setattr(trainer, "export_model", lambda model, out: out.mkdir(parents=True, exist_ok=True) or out)

    def config(**kw) -> LoopConfig:
        base = dict(out=str(tmp_path / "run"), split=str(spec), eval_splits=str(spec), teacher_episodes=4, rounds=1, markets=2,
                    group=2, eval_episodes=6, ladder="greedy,oracle", concurrency=8)
        return LoopConfig(**(base | kw))

    return config, calls, crash, tmp_path / "run"


def cut(world, stage: str, **kw) -> dict:
    """Run the loop until it is killed in the middle of ``stage``; returns loop.json as it was left."""
    config, calls, crash, out = world
    crash["at"] = stage
    with pytest.raises(KeyboardInterrupt):
        run_loop(config(**kw), echo=lambda line: None)
    crash["at"] = None
    return json.loads((Path(config(**kw).out) / "loop.json").read_text())


def test_a_loop_killed_mid_training_resumes_at_that_stage_and_keeps_every_finished_one(world):
    config, calls, crash, out = world
    state = cut(world, "round 1 rft")
    assert state["done"] == ["export", "round 0 teacher", "round 0 train", "serving", "baselines", "round 0 eval", "round 1 collect"]
    assert (out / "round-01" / "checkpoint").exists()  # the cut training's partial output...

    calls.clear()
    data = run_loop(config(), echo=lambda line: None)
    assert calls == ["round 1 rft", "round 1 eval (threshold)"]  # ...is redone; nothing finished runs twice
    train = crash["train_args"][-1]
    assert train.method == "rft" and train.epochs == 1.0 and train.max_steps is None and train.kl_beta == 0.0
    assert train.adapter.endswith("round-00/checkpoint/adapter")
    assert data["done"][-2:] == ["round 1 train", "round 1 eval"]
    assert set(data["rounds"]) == {"0", "1"}
    results = (out / "results.md").read_text()
    for row in ("| SFT (round 0) |", "| round 1 |", "| greedy |", "| oracle |", "| round 1 − SFT (round 0) (paired) |",
                "| round 1 − greedy (paired) |"):
        assert row in results, results
    assert "n=6" in results and (out / "curve.png").stat().st_size > 5000

    calls.clear()
    run_loop(config(), echo=lambda line: None)
    assert calls == []  # a finished run reruns nothing

    calls.clear()
    run_loop(config(rounds=2), echo=lambda line: None)  # more rounds: only the new ones run
    assert calls == ["round 2 collect", "round 2 rft", "round 2 eval (threshold)"]
    paired = [line.split(" |")[0] for line in (out / "results.md").read_text().splitlines() if "(paired)" in line]
    assert paired == ["| SFT (round 0) − greedy (paired)", "| round 1 − SFT (round 0) (paired)", "| round 2 − round 1 (paired)",
                      "| round 2 − SFT (round 0) (paired)", "| round 2 − greedy (paired)"]  # each round against the one before it, the last against SFT and the teacher


def test_each_eval_buyer_type_is_a_column_of_its_own_paired_on_its_own_markets(world):
    config, calls, crash, out = world
    run_loop(config(eval_buyers="threshold,concession"), echo=lambda line: None)
    assert [c for c in calls if "eval" in c] == ["round 0 eval (threshold)", "round 0 eval (concession)", "round 1 eval (threshold)",
                                                  "round 1 eval (concession)"]
    results = (out / "results.md").read_text()
    head, threshold = results.split("### buyers: threshold")
    threshold, concession = threshold.split("### buyers: concession")
    assert head.startswith("## negotiate loop: ") and "### " not in head  # what made the tables, then one section per column
    for section in (threshold, concession):
        for row in ("| SFT (round 0) |", "| round 1 |", "| greedy |", "| round 1 − SFT (round 0) (paired) |"):
            assert row in section, section
    data = json.loads((out / "loop.json").read_text())
    assert set(data["rounds"]["1"]) == {"threshold", "concession"}
    # The columns differ because the buyers do: the same greedy seller on the same markets.
    assert threshold.split("| greedy |")[1].split("\n")[0] != concession.split("| greedy |")[1].split("\n")[0]


def test_a_rerun_may_add_a_buyer_column_and_evaluates_only_that(world):
    config, calls, crash, out = world
    run_loop(config(), echo=lambda line: None)  # threshold buyers only
    seconds = json.loads((out / "loop.json").read_text())["seconds"]["round 1 eval"]
    calls.clear()
    data = run_loop(config(eval_buyers="threshold,concession"), echo=lambda line: None)
    # The baselines and every finished round, against the new column alone; nothing is trained or collected again.
    assert calls == ["baselines (concession)", "round 0 eval (concession)", "round 1 eval (concession)"]
    assert data["columns"] == {stage: ["threshold", "concession"] for stage in ("baselines", "round 0 eval", "round 1 eval")}
    assert set(data["rounds"]["0"]) == set(data["rounds"]["1"]) == {"threshold", "concession"}
    assert data["done"].count("round 1 eval") == 1 and data["seconds"]["round 1 eval"] > seconds
    results = (out / "results.md").read_text()
    assert "### buyers: threshold" in results and "### buyers: concession" in results
    assert "| round 1 − SFT (round 0) (paired) |" in results.split("### buyers: concession")[1]
    calls.clear()
    run_loop(config(eval_buyers="threshold,concession"), echo=lambda line: None)
    assert calls == []
    # A column cannot be taken away (the results would lose it); the run is left as it was.
    with pytest.raises(UserError, match=r"--eval-buyers 'threshold,concession'; rerun with every one of them \(columns may be added\)"):
        run_loop(config(eval_buyers="concession"), echo=lambda line: None)
    # A run from before the columns were kept: each finished evaluation counts as done against the run's own buyers.
    data = json.loads((out / "loop.json").read_text())
    del data["columns"]
    (out / "loop.json").write_text(json.dumps(data))
    run_loop(config(eval_buyers="threshold,concession"), echo=lambda line: None)
    assert calls == []
    # A run folder moved elsewhere resumes there.
    moved = out.parent / "moved"
    out.rename(moved)
    run_loop(config(out=str(moved), eval_buyers="threshold,concession"), echo=lambda line: None)
    assert calls == [] and (moved / "results.md").is_file()


def test_a_run_from_another_runs_sft_takes_the_columns_both_have(world):
    config, calls, crash, out = world
    run_loop(config(rounds=0), echo=lambda line: None)
    calls.clear()
    other = out.parent / "wider"
    data = run_loop(config(out=str(other), sft_from=str(out), eval_buyers="concession,threshold"), echo=lambda line: None)
    assert calls == ["baselines (concession)", "round 0 eval (concession)", "round 1 collect", "round 1 rft",
                     "round 1 eval (concession)", "round 1 eval (threshold)"]
    assert set(data["rounds"]["0"]) == {"threshold", "concession"}
    assert data["rounds"]["0"]["threshold"] == json.loads((out / "loop.json").read_text())["rounds"]["0"]["threshold"]


def test_a_round_whose_groups_all_scored_alike_keeps_the_previous_policy(world):
    config, calls, crash, out = world
    crash["policy"] = "concession"  # deterministic: every repeat of a market plays the same episode
    data = run_loop(config(), echo=lambda line: None)
    assert "round 1 rft" not in calls and data["done"][-2:] == ["round 1 train", "round 1 eval"]
    assert data["notes"] == {"1": "no learning signal: no group had an episode better than its others, so the policy is unchanged"}
    assert (out / "round-01" / "checkpoint" / "adapter" / "adapter_config.json").is_file()  # round 0's, copied
    assert "Round 1: no learning signal" in (out / "results.md").read_text()


def test_a_rerun_with_other_settings_is_refused_naming_the_flag(world):
    config, calls, crash, out = world
    cut(world, "round 0 sft")
    with pytest.raises(UserError, match=r"--teacher.*'greedy'.*rerun with the same value to resume it, or choose another --out"):
        run_loop(config(teacher="posted"), echo=lambda line: None)


def test_a_run_started_where_bf16_is_fast_resumes_in_bf16_where_it_is_not(world, monkeypatch):
    # Killed in SFT on a CPU with bf16 instructions (bf16 left unset: decided there, True), rerun on an AVX2-only one: it
    # resumes in bf16, as it began; asked explicitly for fp32 there, it is refused, naming the flag.
    import negotiate.agents.devices as devices

    config, calls, crash, out = world
    monkeypatch.setattr("negotiate.training.server.detect_device", lambda: "cpu")
    monkeypatch.setattr(devices, "cpu_bf16", lambda: True)
    assert cut(world, "round 0 sft")["config"]["bf16"] is True
    monkeypatch.setattr(devices, "cpu_bf16", lambda: False)
    with pytest.raises(UserError, match=r"has bf16 True; rerun with the same value"):
        run_loop(config(bf16=False), echo=lambda line: None)
    data = run_loop(config(), echo=lambda line: None)
    assert data["config"]["bf16"] is True and all(train.bf16 for train in crash["train_args"])
    assert json.loads((out / "loop.json").read_text())["config"]["bf16"] is True


def test_offline_grpo_rounds_pass_their_kl_and_steps(world):
    config, calls, crash, out = world
    run_loop(config(round_method="offline-grpo", kl_beta=0.05, grpo_steps=3), echo=lambda line: None)
    assert "round 1 offline-grpo" in calls
    train = crash["train_args"][-1]
    assert train.method == "offline-grpo" and train.kl_beta == 0.05
    assert train.max_steps == 3 and train.epochs == 1.0  # the steps given; epochs stays the trainer's default, unused


def test_dagger_rounds_label_the_policys_states_with_the_teacher_and_need_no_group(world):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", teacher="planner", group=1, markets=3, grpo_steps=2), echo=lambda line: None)
    assert "round 1 dagger" in calls
    train = crash["train_args"][-1]
    assert train.method == "dagger" and train.teacher == "planner"
    assert train.min_group == 1 and train.kl_beta == 0.0
    assert len(train.traces) == 1 and train.traces[0].endswith("round-01/rollouts")
    assert json.loads((out / "loop.json").read_text())["done"][-2:] == ["round 1 train", "round 1 eval"]


def test_aggregated_dagger_rounds_learn_from_the_teachers_episodes_and_every_rounds_rollouts(world):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, rounds=2, aggregate=True), echo=lambda line: None)
    assert [c for c in calls if c.endswith("dagger")] == ["round 1 dagger", "round 2 dagger"]
    first, second = crash["train_args"][-2:]

    def traces(train):
        return [Path(t).relative_to(out).as_posix() for t in train.traces]

    assert traces(first) == ["round-00/teacher", "round-01/rollouts"]
    assert traces(second) == ["round-00/teacher", "round-01/rollouts", "round-02/rollouts"]
    for name in traces(second):
        assert any((out / name).rglob("*.jsonl")), name  # each is a folder of finished episodes
    assert second.adapter.endswith("round-01/checkpoint/adapter")


def test_an_aggregated_dagger_round_has_a_signal_from_the_teachers_episodes_even_where_its_rollouts_have_none(world, tmp_path):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, aggregate=True), echo=lambda line: None)
    teacher, rollouts, nothing = out / "round-00" / "teacher", out / "round-01" / "rollouts", tmp_path / "no-episodes"
    nothing.mkdir()  # a round whose every episode was cut short: each trace's first line only, no finished episode
    for trace in trace_files([rollouts]):
        (nothing / trace.name).write_text(trace.read_text().splitlines(keepends=True)[0])
    assert loop.learning_signal([rollouts], "dagger") and loop.learning_signal([teacher], "dagger")
    assert not loop.learning_signal([nothing], "dagger")
    assert loop.learning_signal([teacher, nothing], "dagger")  # what the aggregated round trains on
    assert not loop.learning_signal([nothing], "rft")


def test_action_weights_reach_the_sft_and_the_imitation_rounds_and_round_0_depends_on_them(world):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, action_weights="accept=4"), echo=lambda line: None)
    sft, dagger = crash["train_args"]
    assert sft.action_weights == dagger.action_weights == "accept=4"
    with pytest.raises(UserError, match=r"has action_weights.*round 0 depends on it"):  # another SFT: not taken from this run
        run_loop(config(out=str(out.parent / "b"), sft_from=str(out)), echo=lambda line: None)
    run_loop(config(out=str(out.parent / "c"), sft_from=str(out), action_weights="accept=4", round_method="offline-grpo"),
             echo=lambda line: None)
    assert crash["train_args"][-1].method == "offline-grpo" and crash["train_args"][-1].action_weights == ""  # a policy gradient weighs by advantage only
    run_loop(config(out=str(out.parent / "d"), rounds=0), echo=lambda line: None)
    assert crash["train_args"][-1].method == "sft" and crash["train_args"][-1].action_weights == ""
    # One setting, one spelling: accept=4.0 with offer=1 is accept=4, so the first run resumes with it (nothing left to do).
    calls.clear()
    run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, action_weights="offer=1, accept=4.0"), echo=lambda line: None)
    assert calls == [] and json.loads((out / "loop.json").read_text())["config"]["action_weights"] == "accept=4"


def test_round_action_weights_replace_the_sfts_in_the_rounds_so_a_weighted_sft_can_have_unweighted_rounds(world):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, action_weights="accept=4", round_action_weights="end=2"),
             echo=lambda line: None)
    sft, dagger = crash["train_args"]
    assert sft.action_weights == "accept=4" and dagger.action_weights == "end=2"
    # The SFT does not depend on the rounds' weights: --sft-from takes it, and "none" makes the rounds weigh every decision 1.
    crash["args"].clear()
    crash["train_args"].clear()
    run_loop(config(out=str(out.parent / "b"), sft_from=str(out), round_method="dagger", group=1, markets=3, grpo_steps=2,
                    action_weights="accept=4", round_action_weights="none"), echo=lambda line: None)
    assert "round 0 sft" not in crash["args"] and [t.method for t in crash["train_args"]] == ["dagger"]
    assert crash["train_args"][0].action_weights == ""
    assert json.loads((out.parent / "b" / "loop.json").read_text())["config"]["round_action_weights"] == ""
    # A run's rounds keep their weights: resuming with others is refused.
    with pytest.raises(UserError, match="round_action_weights|round-action-weights"):
        run_loop(config(round_method="dagger", group=1, markets=3, grpo_steps=2, action_weights="accept=4"), echo=lambda line: None)


def test_results_say_where_each_policy_departs_from_its_teacher_on_the_held_out_states(world):
    config, calls, crash, out = world
    run_loop(config(eval_buyers="threshold,concession", buyers="concession"), echo=lambda line: None)
    results = (out / "results.md").read_text()
    section = results[results.index("### against the teacher (greedy), on the held-out states (buyers: concession)"):]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith(("| SFT", "| round"))]
    assert [row[0] for row in rows] == ["| SFT (round 0)", "| round 1"]
    for row, k in zip(rows, (0, 1)):  # the states are the policy's messages in that round's held-out episodes of the --buyers column
        folder = out / f"round-{k:02d}" / "eval" / "concession"
        assert int(row[1]) == sum(1 for path in trace_files([folder]) for ep in read_records(path) for e in ep.messages()
                                  if e.sender == "seller")
    run_loop(config(out=str(out.parent / "oracle"), teacher="oracle", rounds=0), echo=lambda line: None)
    assert "against the teacher" not in (out.parent / "oracle" / "results.md").read_text()  # the oracle cannot follow an episode
    assert "thoughts against the teacher's reasons" not in results  # greedy gives none
    # A teacher that gives its reasons: the policy's thoughts against them (here the policy is that teacher itself).
    crash["policy"] = "planner?reasons=1"
    run_loop(config(out=str(out.parent / "reasons"), teacher="planner?reasons=1", rounds=0, ladder="greedy,planner",
                    untrained=False),
             echo=lambda line: None)
    results = (out.parent / "reasons" / "results.md").read_text()
    assert "| SFT (round 0) − planner (paired) |" in results  # its reasons change no action: the ladder's planner is its row
    section = results.split("thoughts against the teacher's reasons")[1]
    (row,) = [line for line in section.splitlines() if line.startswith("| SFT (round 0)")]
    assert row.endswith("| 100% | 100% | 100% | 100% | 100% |") and int(row.split(" | ")[1]) > 0


def test_a_run_from_before_round_method_resumes_with_offline_grpo(world):
    config, calls, crash, out = world
    state = cut(world, "round 1 rft")
    for name in ("round_method", "round_epochs", "sft_from"):  # as loop.json was written before these flags
        del state["config"][name]
    (out / "loop.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match=r"--round-method 'offline-grpo'"):
        run_loop(config(), echo=lambda line: None)  # its rounds were GRPO: rft now would mix two methods in one run
    calls.clear()
    run_loop(config(round_method="offline-grpo"), echo=lambda line: None)
    assert calls == ["round 1 offline-grpo", "round 1 eval (threshold)"]


def test_a_run_takes_round_0_from_an_earlier_one_and_only_trains_its_rounds(world):
    config, calls, crash, out = world
    run_loop(config(rounds=0), echo=lambda line: None)
    first = json.loads((out / "loop.json").read_text())
    first["port"] = 8123  # as a run that started its own server records it
    (out / "loop.json").write_text(json.dumps(first))
    calls.clear()
    other = out.parent / "ablation"
    data = run_loop(config(out=str(other), sft_from=str(out), markets=3, round_method="offline-grpo"), echo=lambda line: None)
    assert calls == ["round 1 collect", "round 1 offline-grpo", "round 1 eval (threshold)"]  # no teacher, SFT, baselines or round 0 eval
    assert data["rounds"]["0"] == first["rounds"]["0"] and data["serving"] == first["serving"]
    assert data["port"] != 8123  # its own server: not the source run's port
    assert data["done"][:6] == list(loop.ROUND0_STAGES)
    teacher = sorted(p.relative_to(out) for p in (out / "round-00").rglob("*") if p.is_file())
    assert teacher and sorted(p.relative_to(other) for p in (other / "round-00").rglob("*") if p.is_file()) == teacher
    assert crash["train_args"][-1].adapter == str(other / "round-00" / "checkpoint" / "adapter")
    results = (other / "results.md").read_text()
    assert "| SFT (round 0) |" in results and "| round 1 − SFT (round 0) (paired) |" in results and "| greedy |" in results
    # A flag round 0 depends on must match; the round's own flags may differ (markets, method, above).
    with pytest.raises(UserError, match=r"has sft_lr.*round 0 depends on it"):
        run_loop(config(out=str(out.parent / "c"), sft_from=str(out), sft_lr=1e-3), echo=lambda line: None)
    with pytest.raises(UserError, match=r"--sft-from.*not a loop run folder"):
        run_loop(config(out=str(out.parent / "d"), sft_from=str(out.parent / "nothing")), echo=lambda line: None)
    cut(world, "round 0 sft", out=str(out.parent / "e"))
    with pytest.raises(UserError, match=r"round 0 of that run is not finished \(round 0 train, serving, baselines, round 0 eval missing\)"):
        run_loop(config(out=str(out.parent / "f"), sft_from=str(out.parent / "e")), echo=lambda line: None)


def test_other_evaluation_flags_take_the_sft_and_evaluate_it_again(world):
    config, calls, crash, out = world
    run_loop(config(rounds=0), echo=lambda line: None)
    assert "legal=1" not in crash["args"]["round 0 eval (threshold)"][crash["args"]["round 0 eval (threshold)"].index("--seller") + 1]
    calls.clear()
    other = out.parent / "legal"
    data = run_loop(config(out=str(other), sft_from=str(out), legal=True, eval_episodes=4), echo=lambda line: None)
    # The SFT is taken; the baselines and round 0 are evaluated again, under the new flags, and the round runs.
    assert calls == ["baselines (threshold)", "round 0 eval (threshold)", "round 1 collect", "round 1 rft", "round 1 eval (threshold)"]
    for stage in ("round 0 eval (threshold)", "round 1 collect", "round 1 eval (threshold)"):
        args = crash["args"][stage]
        assert args[args.index("--seller") + 1].endswith("&legal=1"), stage
    assert data["done"][:4] == list(loop.SFT_STAGES) and data["serving"] == {"mode": "merged", "why": "test"}
    assert (other / "round-00" / "teacher").is_dir() and (other / "round-00" / "checkpoint" / "adapter").is_dir()
    assert "n=4" in (other / "results.md").read_text() and "n=6" not in (other / "results.md").read_text()
    # The earlier run's evaluation is left where it was, not linked into this one.
    assert (out / "round-00" / "eval").is_dir()
    theirs = {p.stat().st_ino for p in (out / "round-00" / "eval").rglob("*.jsonl")}
    ours = {p.stat().st_ino for p in (other / "round-00" / "eval").rglob("*.jsonl")}
    assert ours and not ours & theirs
    assert json.loads((other / "loop.json").read_text())["rounds"]["0"] != json.loads((out / "loop.json").read_text())["rounds"]["0"]


def test_grounded_decoding_takes_the_sft_and_evaluates_it_again(world):
    config, calls, crash, out = world
    run_loop(config(rounds=0, prompt="facts", legal=True), echo=lambda line: None)
    calls.clear()
    run_loop(config(out=str(out.parent / "grounded"), sft_from=str(out), rounds=0, prompt="facts", legal=True, grounded=True),
             echo=lambda line: None)
    assert calls == ["baselines (threshold)", "round 0 eval (threshold)"]
    args = crash["args"]["round 0 eval (threshold)"]
    assert args[args.index("--seller") + 1].endswith("&legal=1&grounded=1&prompt=facts")


def test_the_compact_prompt_goes_to_the_sft_and_into_the_policys_spec(world):
    config, calls, crash, out = world
    run_loop(config(prompt="compact"), echo=lambda line: None)
    sft, round1 = crash["train_args"]
    assert sft.method == "sft" and sft.prompt == "compact"
    assert round1.prompt == "compact"
    for stage in ("round 0 eval (threshold)", "round 1 collect", "round 1 eval (threshold)"):
        args = crash["args"][stage]
        assert args[args.index("--seller") + 1].endswith("&prompt=compact"), stage
    # The SFT depends on the prompt: another run cannot take it with the full prompt...
    with pytest.raises(UserError, match=r"--prompt 'compact'; round 0 depends on it"):
        run_loop(config(out=str(out.parent / "full"), sft_from=str(out)), echo=lambda line: None)
    # ...and a run from before the flag had the full prompt.
    state = json.loads((out / "loop.json").read_text())
    del state["config"]["prompt"]
    (out / "loop.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match=r"--prompt 'full'"):
        run_loop(config(prompt="compact"), echo=lambda line: None)


def test_under_the_tools_prompt_the_results_say_which_tool_each_policy_followed(world):
    config, calls, crash, out = world
    run_loop(config(prompt="tools", rounds=1), echo=lambda line: None)
    text = (out / "results.md").read_text()
    section = text.split("### which tool the policy followed, on the held-out states (buyers: threshold)")[1]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith(("| SFT", "| round"))]
    assert [row[0] for row in rows] == ["| SFT (round 0)", "| round 1"]
    messages = sum(1 for path in trace_files([out / "round-00" / "eval"]) for record in read_records(path)
                   for _ in record.seller_messages())
    sft = [int(cell.strip(" |")) for cell in rows[0][1:]]
    assert sft[0] == messages == sum(sft[1:])  # every message counted once
    assert sft[-2] > 0  # the stand-in policy (random) sends messages neither tool would
    run_loop(config(out=str(out.parent / "plain"), rounds=0), echo=lambda line: None)  # the facts of another prompt: no table
    assert "which tool" not in (out.parent / "plain" / "results.md").read_text()


def test_under_the_tools_prompt_the_headline_is_the_policy_against_the_best_fixed_rule_over_its_tools(world):
    """Issue 41: a policy shown scripted moves is measured against the best fixed rule over them: every one of the 22
    rules over the tools prompt's two is evaluated beside the ladder, and the first paired row is the last policy
    against the one with the highest mean profit/OPT."""
    from negotiate.agents.rule import rules_over
    from negotiate.agents.views.tools import TOOLS

    config, calls, crash, out = world
    run_loop(config(prompt="tools", rounds=1), echo=lambda line: None)
    ratios: dict[str, list[float]] = {}
    for path in trace_files([out / "baselines"]):
        for record in read_records(path):
            ratios.setdefault(record.start.seller, []).append(record.metrics["profit_ratio"])
    rules = rules_over(TOOLS)
    assert len(rules) == 22 and set(rules) <= set(ratios)
    means = {rule: sum(ratios[rule]) / len(ratios[rule]) for rule in rules if None not in ratios[rule]}
    best = max(means, key=means.get)
    text = (out / "results.md").read_text()
    assert "first paired row: round 1 against the best of the 22 fixed rules" in text
    paired = [line for line in text.splitlines() if "(paired)" in line]
    assert paired[0].startswith(f"| round 1 − {best} (paired) |")
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| rule?") or line.startswith("| greedy")]
    assert len(rows) == 21  # every rule, and greedy (the ladder's and a tool); planner?reasons=1 is a row of its own
    run_loop(config(out=str(out.parent / "plain"), rounds=0), echo=lambda line: None)  # the full prompt shows no moves
    assert "fixed rules" not in (out.parent / "plain" / "results.md").read_text()


def test_a_lookup_table_is_played_beside_the_fixed_rules_and_counts_for_the_headline(world, tmp_path):
    """``rule_tables``: each table (benchmarks/hindsight.py's) is one more rule over the tools, evaluated on the held-out
    markets with the others and a candidate for the best rule; it needs a prompt that shows two tools."""
    from negotiate.agents.rule import table_rule
    from negotiate.agents.views.tools import TOOLS

    config, calls, crash, out = world
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"none/offer/offer/apart/4": "greedy", "hold out/reject/accept/same/1": "greedy"}))
    run_loop(config(prompt="tools", rounds=0, rule_tables=str(table)), echo=lambda line: None)
    sellers = {record.start.seller for path in trace_files([out / "baselines"]) for record in read_records(path)}
    assert table_rule(TOOLS, str(table.resolve())) in sellers
    assert "against the best of the 23 fixed rules" in (out / "results.md").read_text()
    with pytest.raises(UserError, match=r"rule_tables.*a table chooses between two tools, and --prompt compact shows 0"):
        config(prompt="compact", rule_tables=str(table)).check()
    table.write_text('{"none/offer/offer/apart/4": "posted"}')
    with pytest.raises(UserError, match=r"names 'posted', not one of the tools"):
        config(out=str(tmp_path / "other"), prompt="tools", rule_tables=str(table)).check()


def test_results_say_the_command_the_commit_the_seeds_the_wall_time_and_the_load(world, monkeypatch):
    """Issue 41: each results table gives what made it and under what load; a resumed run lists each command."""
    import subprocess

    from negotiate.training.loop import run as loop_run

    config, calls, crash, out = world
    monkeypatch.setattr(loop_run.os, "getloadavg", lambda: (3.0, 1.5, 1.0))
    run_loop(config(rounds=0), echo=lambda line: None, command="negotiate loop --out x")
    run_loop(config(rounds=1), echo=lambda line: None, command="negotiate loop --out x --rounds 1")
    head = (out / "results.md").read_text().split("### buyers")[0]
    here = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert f"- `negotiate loop --out x` at commit `{here}" in head and "- `negotiate loop --out x --rounds 1` at commit" in head
    assert f"training run seed 0 (round K collects on 0 + K); held out: run seed 1000003, 6 markets of each of {config().split}" in head
    assert "wall time in stages: " in head and "- load (5-minute average as each stage ended): 1.5 to 1.5" in head
    data = json.loads((out / "loop.json").read_text())
    assert set(data["load"]) == set(data["seconds"]) == set(data["done"])


def test_a_failing_stage_is_one_line_that_says_how_to_resume(world, monkeypatch):
    config, calls, crash, out = world

    def broken(name, args, out_file, **kw):
        raise LoopError(f"{name} failed (exit 2): negotiate: --split: no such split (output: {out_file})")

    monkeypatch.setattr(loop.stages, "run_stage", broken)
    with pytest.raises(LoopError) as caught:
        run_loop(config(), echo=lambda line: None)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("teacher episodes failed (exit 2)")
    assert message.endswith("(finished stages are kept: rerun the same command to resume)")
    assert json.loads((out / "loop.json").read_text())["done"] == ["export"]


def test_the_real_stage_runner_reports_the_commands_last_line(tmp_path):
    with pytest.raises(LoopError, match=r"^teacher failed \(exit 2\): .*--split.*nope.*\(output: .*loop.out\)$"):
        loop.run_stage("teacher", ["serve", "--seller", "greedy", "--split", "nope", "--episodes", "1", "--out", str(tmp_path / "x")],
                       tmp_path / "loop.out")


def test_a_stopped_loop_stops_its_stage_as_the_stage_would_stop_alone(tmp_path):
    """SIGTERM to the loop (a scheduler's time limit) reaches its running stage as SIGTERM, not SIGKILL: the stage
    ends as ``serve`` does when stopped (exit 143, its episodes whole, the --resume line), then the loop stops."""
    import signal

    from negotiate.cli import Terminated
    from negotiate.trace import read_records, trace_files

    out = tmp_path / "x"

    def terminate(signum, frame):  # every 0.5 s; once the stage has written an episode, the loop is stopped
        if (out / "greedy.jsonl").is_file() and (out / "greedy.jsonl").stat().st_size > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)  # once
            raise Terminated

    previous = signal.signal(signal.SIGALRM, terminate)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 0.5)
    try:
        with pytest.raises(Terminated):
            loop.run_stage("teacher", ["serve", "--seller", "greedy", "--split", "train", "--episodes", "2000000", "--out", str(out)],
                           tmp_path / "loop.out")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    printed = (tmp_path / "loop.out").read_text()
    assert "negotiate serve --resume" in printed  # what serve prints when stopped; SIGKILL left no line
    records = [r for path in trace_files([out]) for r in read_records(path, allow_partial=True)]
    assert records and all(r.complete for r in records)  # every episode in the trace is whole


@pytest.mark.parametrize("printed, tolerated", [
    ("2 of 6 episodes failed (commonest reason, 2 of them: LLMError: down); each one is in x/serve.log.jsonl", True),
    ("Traceback (most recent call last):\nMemoryError", False),  # a crash exits 1 too: the stage is not finished
])
def test_a_stage_that_exits_1_saying_episodes_failed_is_not_finished_and_a_crash_is_a_crash(tmp_path, monkeypatch, printed, tolerated):
    import sys

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nprintf '%b\\n' {printed!r}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    (tmp_path / "loop.out").write_text("2 of 6 episodes failed (commonest reason, ...) from an earlier stage\n")
    if tolerated:  # the run went to its end with failed episodes: the stage says so, naming what it printed
        with pytest.raises(loop.FailedEpisodes, match=r"^round 1 collect: 2 of 6 episodes failed \(commonest reason, 2 of them"):
            loop.run_stage("round 1 collect", ["collect"], tmp_path / "loop.out")
    else:
        with pytest.raises(LoopError, match=r"^round 1 collect failed \(exit 1\): MemoryError"):
            loop.run_stage("round 1 collect", ["collect"], tmp_path / "loop.out")


@pytest.mark.parametrize("change, flag", [
    ({"eval_seed": 1}, "^eval_seed"),  # keys are named as keys: loop has no --eval-seed
    ({"serve": "merged", "server_url": "http://127.0.0.1:8000/v1"}, "^serve: 'merged'"),
    ({"serve": "sometimes"}, "^serve: 'sometimes'"),
    ({"lora_r": 12}, "^lora_r"),
    ({"group": 1}, "^group"),
    ({"split": "specs/nope.toml"}, "--split"),
    ({"round_method": "ppo"}, "--round-method"),
    ({"round_epochs": 0}, "^round_epochs"),
    ({"round_method": "dagger", "group": 0}, "^group"),
    ({"round_method": "dagger", "teacher": "oracle"}, "--teacher: 'oracle': this seller cannot follow"),
    ({"aggregate": True}, "^aggregate: True: aggregates the teacher's labels: use it with --round-method dagger"),
    ({"buyers": "nosuch"}, "--buyers: 'nosuch': unknown buyer agent"),
    ({"eval_buyers": "threshold,nosuch"}, "--eval-buyers: 'nosuch': unknown buyer agent"),
    ({"teacher": "nosuch"}, "--teacher: 'nosuch'"),
    ({"action_weights": "bid=2"}, "^action_weights: 'bid=2': 'bid' is not a seller action"),
    ({"round_action_weights": "bid=2"}, "^round_action_weights: 'bid=2': 'bid' is not a seller action"),
    ({"round_method": "offline-grpo", "round_action_weights": "accept=2"}, "^round_action_weights: 'accept=2': offline-grpo rounds"),
    ({"eval_buyers": " "}, "--eval-buyers: ' ': give at least one buyer spec"),
    ({"grounded": True, "legal": True, "prompt": "compact"}, "--grounded: True: grounded=1 binds the thought to the facts prompt"),
    ({"grounded": True, "legal": True, "prompt": "tools"}, "--grounded: True: grounded=1 binds the thought to the facts prompt"),
    ({"teacher_traces": "/nonexistent/traces"}, "^teacher_traces: '/nonexistent/traces': no such file or folder"),
    ({"teacher_traces": "specs"}, "no \\*.jsonl trace files found"),
    ({"teacher_traces": "tests/fixtures", "round_method": "dagger"}, "--round-method: 'dagger': dagger rounds label the policy's states"),
])
def test_bad_settings_are_refused_before_anything_runs(change, flag, tmp_path):
    with pytest.raises(UserError, match=flag):
        LoopConfig(**({"out": str(tmp_path / "x"), "split": "train", "eval_splits": "train"} | change)).check()


def test_the_results_table_pairs_rows_on_the_markets_both_played():
    a = {("s", 0): {"profit_ratio": 0.5, "valid_rate": 1.0}, ("s", 1): {"profit_ratio": 0.7, "valid_rate": 0.5},
         ("s", 2): {"profit_ratio": 0.9, "valid_rate": 1.0}}
    b = {("s", 0): {"profit_ratio": 0.4, "valid_rate": 1.0}, ("s", 1): {"profit_ratio": 0.4, "valid_rate": 1.0}}
    table = results_table([("a", a), ("b", b)], ["s"], [("a", "b")])
    lines = table.splitlines()
    # a: mean 0.7, sd 0.2 over 3 -> half-width t(0.975, 2) * 0.2 / sqrt(3) = 4.30265 * 0.11547 = 0.497 (Student's t, as
    # negotiate report); valid (1 + 0.5 + 1) / 3 = 0.83.
    assert lines[2] == "| a | 0.700 ± 0.497 (valid 0.83, n=3) |"
    # Paired on markets 0 and 1 only: differences 0.1 and 0.3, mean 0.2, sd 0.1414 -> t(0.975, 1) = 12.7062 * 0.1 = 1.271.
    assert lines[4] == "| a − b (paired) | 0.200 ± 1.271 (n=2) |"
    # Two splits: a pooled column, every market of both splits in one mean.
    a2 = a | {("t", 0): {"profit_ratio": 0.3, "valid_rate": 0.0}}
    b2 = b | {("t", 0): {"profit_ratio": 0.5, "valid_rate": 1.0}}
    lines = results_table([("a", a2), ("b", b2)], ["s", "t"], [("a", "b")]).splitlines()
    assert lines[0] == "| seller | s | t | all splits |"
    # a over all four: mean 0.6, sd sqrt(((-0.1)^2 + 0.1^2 + 0.3^2 + (-0.3)^2) / 3) = 0.2582 -> t(0.975, 3) = 3.18245 * 0.2582 / 2
    # = 0.411.
    assert lines[2] == "| a | 0.700 ± 0.497 (valid 0.83, n=3) | 0.300 (valid 0.00, n=1) | 0.600 ± 0.411 (valid 0.62, n=4) |"
    # Paired on (s, 0), (s, 1), (t, 0): 0.1, 0.3, -0.2; mean 0.0667, sd 0.2517 -> 4.30265 * 0.2517 / sqrt(3) = 0.625.
    assert lines[4] == "| a − b (paired) | 0.200 ± 1.271 (n=2) | -0.200 (n=1) | 0.067 ± 0.625 (n=3) |"
    # The pooled column pools the splits shown, not every market the rows hold.
    lines = results_table([("a", a2 | {("u", 0): {"profit_ratio": 0.0, "valid_rate": 1.0}}), ("b", b2)], ["s", "t"]).splitlines()
    assert lines[2].endswith("| 0.600 ± 0.411 (valid 0.62, n=4) |")


def test_buyers_sets_who_the_teacher_and_the_rollouts_play_against_and_eval_buyers_are_the_columns(world):
    config, calls, crash, out = world
    run_loop(config(round_method="dagger", teacher="planner", buyers="concession", group=1, markets=3, grpo_steps=2,
                    eval_buyers="threshold"), echo=lambda line: None)
    def buyers(folder):
        return {record.start.buyers for path in trace_files([folder]) for record in read_records(path)}

    assert buyers(out / "round-00" / "teacher") == {"concession"}  # SFT's data: the planner against conceding buyers
    assert buyers(out / "round-01" / "rollouts") == {"concession"}  # the round's states too
    assert buyers(out / "round-01" / "eval" / "threshold") == {"threshold"}  # held out: the columns asked for
    teacher = crash["args"]["teacher episodes"]
    assert teacher[teacher.index("--seller") + 1] == "planner"


def test_fresh_reaches_the_teacher_the_rollouts_and_every_evaluation_and_round_0_depends_on_it(world):
    config, calls, crash, out = world
    run_loop(config(fresh=True, round_method="dagger", teacher="planner", group=1), echo=lambda line: None)
    def fresh(folder):
        return {record.start.fresh for path in trace_files([folder]) for record in read_records(path)}

    for folder in ("round-00/teacher", "baselines/threshold", "round-00/eval/threshold", "round-01/rollouts",
                   "round-01/eval/threshold"):
        assert fresh(out / folder) == {True}, folder
    # The teacher's episodes were played under it: another run cannot take this SFT without it.
    with pytest.raises(UserError, match=r"has fresh True; round 0 depends on it"):
        run_loop(config(out=str(out.parent / "stale"), sft_from=str(out), round_method="dagger", teacher="planner", group=1),
                 echo=lambda line: None)
    # A run from before the flag asked its sellers at once.
    state = json.loads((out / "loop.json").read_text())
    del state["config"]["fresh"]
    (out / "loop.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match=r"has fresh False; rerun with the same value"):
        run_loop(config(fresh=True, round_method="dagger", teacher="planner", group=1), echo=lambda line: None)


# -- negotiate loop --config FILE ----------------------------------------------------------------------

def _config_from(argv):
    from negotiate.cli import _parser

    return read_command(_parser().parse_args(["loop", *argv]), "loop", (LoopConfig,)).of(LoopConfig)


def test_a_config_file_sets_the_loop_flags_and_the_command_line_overrides_it(tmp_path):
    file = tmp_path / "run.toml"
    file.write_text('teacher = "planner"\nteacher-episodes = 600\nlegal = true\nsft_lr = 1\nrounds = 3\nsplit = "train"\n'
                    'eval_splits = "train"\n')
    config = _config_from(["--config", str(file), "--out", str(tmp_path / "x")])
    assert (config.teacher, config.teacher_episodes, config.legal, config.sft_lr, config.rounds) == ("planner", 600, True, 1.0, 3)
    assert config.sft_steps == LoopConfig().sft_steps  # not in the file: the default
    # --set wins over the file, and a flag typed over both, even where it says what the default says (legal=false, --rounds 2)
    config = _config_from(["--config", str(file), "--set", "legal=false", "--set", "teacher-episodes=5", "--rounds", "2",
                           "--set", "rounds=4"])
    assert (config.legal, config.rounds, config.teacher_episodes, config.teacher) == (False, 2, 5, "planner")
    expected = LoopConfig(split="train", eval_splits="train")
    expected.check()  # bf16 left unset is decided by the machine
    assert _config_from(["--split", "train", "--eval-splits", "train"]) == expected


def test_sft_on_given_teacher_traces_copies_them_into_the_run_and_plays_no_teacher(world, tmp_path):
    config, calls, crash, out = world
    given = tmp_path / "given"
    assert main(["serve", "--seller", "planner", "--split", config().split, "--buyers", "threshold", "--episodes", "3",
                 "--seed", "5", "--out", str(given), "--quiet"]) == 0
    (trace,) = trace_files([given])
    run_loop(config(teacher_traces=str(given), teacher="planner", rounds=1), echo=lambda line: None)
    assert "teacher episodes" not in calls and "round 0 sft" in calls
    (copied,) = trace_files([out / "round-00" / "teacher"])
    assert copied.read_bytes() == trace.read_bytes()
    sft, round1 = crash["train_args"]
    assert sft.traces == (str(out / "round-00" / "teacher"),) and round1.method == "rft"
    assert json.loads((out / "loop.json").read_text())["config"]["teacher_traces"] == str(given.resolve())
    # The run keeps its copy: with the given traces gone, a rerun still resumes (and finds nothing left to do).
    for path in given.iterdir():
        path.unlink()
    given.rmdir()
    calls.clear()
    run_loop(config(teacher_traces=str(given), teacher="planner", rounds=1), echo=lambda line: None)
    assert calls == []
    # Round 0 learned from those traces: a rerun, or a run taking its SFT, with other traces (or none) is refused.
    with pytest.raises(UserError, match="has teacher_traces '.*given'; rerun with the same value"):
        run_loop(config(teacher="planner", rounds=1), echo=lambda line: None)
    with pytest.raises(UserError, match=r"has teacher_traces '.*given'; round 0 depends on it"):
        run_loop(config(out=str(out.parent / "other"), sft_from=str(out), teacher="planner"), echo=lambda line: None)


def test_the_readmes_loop_runs_are_config_files_that_check(tmp_path, monkeypatch):
    given = ("hindsight-tools", "table-sft")  # their teacher traces are made by a script first (checked below, or in their study)
    files = sorted(f for f in Path("docs/experiments").glob("*.toml") if f.stem not in given
                   and not f.read_text().startswith("# negotiate teach"))  # teach's configs: tests/test_teach.py checks them
    assert {f.stem for f in files} >= {"planner-concession", "planner-accept4", "accept4-rounds"}
    configs = {f.stem: _config_from(["--config", str(f)]) for f in files}
    # the settings the README's planner/conceding run was made with (its loop.json), flag for flag
    default = LoopConfig()
    default.check()
    assert {k: v for k, v in configs["planner-concession"].to_json().items() if getattr(default, k) != v} == {
        "teacher": "planner", "buyers": "concession", "teacher_episodes": 600, "sft_steps": 160, "sft_batch": 16, "rounds": 3,
        "round_method": "dagger", "markets": 128, "group": 2, "grpo_steps": 64, "aggregate": True,
        "eval_buyers": "concession,threshold", "ladder": "greedy,planner,posted,concession,dutch,oracle", "untrained": False,
        "legal": True, "prompt": "compact"}
    a, b = configs["planner-concession"].to_json(), configs["planner-accept4"].to_json()
    # the weighted run is the planner/conceding run with accept=4, one round and the conceding column only
    assert {k for k in a if a[k] != b[k]} == {"action_weights", "rounds", "eval_buyers"}
    assert configs["accept4-rounds"].action_weights == "accept=4" and configs["accept4-rounds"].round_weights == ""
    # the best run so far (runs/cost-grounded, then runs/dagger64-a4, their loop.json), evaluated greedily
    fresh, grounded = configs["planner-fresh"].to_json(), configs["grounded-dagger"].to_json()
    assert {k: grounded[k] for k in grounded if grounded[k] != fresh[k]} == {
        "sft_steps": 80, "grounded": True, "rounds": 2, "aggregate": False, "markets": 64, "group": 1,
        "round_action_weights": "accept=4", "eval_temperature": 0.0}
    # the advised SFT is the grounded run's with the advice prompt and no round; its rounds reuse that SFT (--sft-from)
    advice, rft = configs["advice"].to_json(), configs["advice-rft"].to_json()
    assert {k: advice[k] for k in advice if advice[k] != grounded[k]} == {"prompt": "advice", "rounds": 0}
    assert {k: rft[k] for k in rft if rft[k] != advice[k]} == {
        "rounds": 2, "round_method": "rft", "group": 4, "temperature": 1.5, "round_epochs": 2.0, "grpo_steps": None,
        "round_action_weights": None}  # the rounds weigh as the SFT did: every decision 1
    assert all(advice[name] == rft[name] for name in SFT_FIELDS + EVAL_FIELDS)  # so --sft-from takes its SFT and evaluations
    # the hindsight run is the advised SFT with both tools, 120 steps, its teacher episodes given, and two buyer columns
    root = Path.cwd()
    given = tmp_path / "runs" / "hindsight"
    given.mkdir(parents=True)
    (given / "hindsight.jsonl").write_text("")
    (given / "table-label.json").write_text("{}")  # the table hindsight.py fits on the same labels
    (tmp_path / "specs").symlink_to(root / "specs")
    monkeypatch.chdir(tmp_path)  # the file names runs/hindsight, where benchmarks/hindsight.py writes it
    tools = _config_from(["--config", str(root / "docs" / "experiments" / "hindsight-tools.toml")]).to_json()
    assert {k: tools[k] for k in tools if tools[k] != advice[k]} == {
        "teacher_traces": str(given), "prompt": "tools", "grounded": False, "seed": 7, "sft_steps": 120, "round_method": "rft",
        "group": 4, "round_action_weights": None, "grpo_steps": None, "eval_buyers": "concession,threshold",
        "teacher_episodes": 400,  # unused: the teacher episodes are given
        "rule_tables": str(given / "table-label.json")}


@pytest.mark.parametrize("text, message", [
    ("teacher_epsiodes = 600\n", "teacher_epsiodes: not a loop setting; choose from model, teacher, action_weights"),
    ('rounds = "two"\n', "rounds: 'two': must be a whole number"),
    ("legal = 1\n", "legal: 1: must be true or false"),
    ("sft_lr = true\n", "sft_lr: True: must be a number"),
    ('teacher = 3\n', "teacher: 3: must be a string"),
    ("rounds = 2\nrounds-x = 1\n", "rounds-x: not a loop setting"),
    ("sft-steps = 2\nsft_steps = 3\n", "sft_steps: is given twice"),
    ("rounds = \n", "not valid TOML"),
    ('round_method = "foo"\n', "round_method: 'foo': choose from rft, dagger, offline-grpo"),  # a value check() refuses
    ("rounds = -1\n", "rounds: -1: must be 0 or more"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, message):
    file = tmp_path / "bad.toml"
    file.write_text(text)
    assert main(["loop", "--config", str(file), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"negotiate loop: error: {file}: ") and message in err
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_a_missing_or_unreadable_config_file_is_named(tmp_path, capsys):
    assert main(["loop", "--config", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "run")]) == 2
    assert f"--config: '{tmp_path / 'nope.toml'}': cannot read it" in capsys.readouterr().err
    assert main(["loop", "--config", "", "--out", str(tmp_path / "run")]) == 2
    assert "--config: '': cannot read it" in capsys.readouterr().err
    (tmp_path / "latin.toml").write_bytes(b"teacher = '\xe9'\n")
    assert main(["loop", "--config", str(tmp_path / "latin.toml"), "--out", str(tmp_path / "run")]) == 2
    assert f"{tmp_path / 'latin.toml'}: not valid TOML" in capsys.readouterr().err
    # a bad flag typed on the command line is the flag's error, not the file's
    (tmp_path / "ok.toml").write_text("rounds = 1\n")
    assert main(["loop", "--config", str(tmp_path / "ok.toml"), "--round-method", "foo", "--out", str(tmp_path / "run")]) == 2
    assert "negotiate loop: error: --round-method: 'foo'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_round_action_weights_equal_to_the_sfts_are_stored_as_the_default(tmp_path):
    def checked(**kw) -> LoopConfig:
        config = LoopConfig(out=str(tmp_path / "x"), split="train", eval_splits="train", **kw)
        config.check()
        return config

    same = checked(action_weights="accept=4.0", round_action_weights="offer=1, accept=4")
    assert (same.round_action_weights, same.round_weights) == (None, "accept=4")  # so a resume without the flag matches
    none = checked(action_weights="accept=4", round_action_weights="none")
    assert (none.round_action_weights, none.round_weights) == ("", "")
    other = checked(round_action_weights="end=2")
    assert (other.action_weights, other.round_weights) == ("", "end=2")


@pytest.mark.parametrize(("has_bf16", "given", "expected"), [(True, None, True), (False, None, False), (False, True, True),
                                                             (True, False, False)])
def test_bf16_left_unset_follows_the_cpu_and_is_kept_as_decided(monkeypatch, tmp_path, has_bf16, given, expected):
    import negotiate.agents.devices as devices

    monkeypatch.setattr(devices, "cpu_bf16", lambda: has_bf16)
    monkeypatch.setattr("negotiate.training.server.detect_device", lambda: "cpu")
    argv = ["--split", "train", "--eval-splits", "train", *([] if given is None else ["--set", f"bf16={str(given).lower()}"])]
    config = _config_from(argv)
    assert config.bf16 is expected and config.to_json()["bf16"] is expected  # loop.json holds the decision, not "auto"


# -- failed episodes: a stage is finished only when every episode is -----------------------------------------------------


def _failing(monkeypatch, stage: str, times: int):
    """The world's stage runner, but ``stage`` (and its replay of failed episodes) ends with failed episodes ``times``
    times, as a stage whose server died does: its finished episodes are written, the stage exits 1 saying so."""
    played, restarts = [], []
    inner = loop.stages.run_stage

    def run_stage(name, args, out_file, *, tolerate_failed_episodes=True, **shown):
        seconds = inner(name, args, out_file, tolerate_failed_episodes=tolerate_failed_episodes, **shown)
        played.append((name, args))
        if name.startswith(stage) and len([n for n, _ in played if n.startswith(stage)]) <= times:
            raise loop.FailedEpisodes(f"{name}: 2 of 6 episodes failed (commonest reason: cannot reach the server) (output: x)")
        return seconds

    monkeypatch.setattr(loop.stages, "run_stage", run_stage)
    monkeypatch.setattr(loop.Serving, "restart", lambda self, r: restarts.append(r) or ("http://127.0.0.1:9/v1", f"round-{r}"))
    return played, restarts


def test_an_evaluation_with_failed_episodes_restarts_the_server_and_plays_them_again(world, monkeypatch):
    config, calls, crash, out = world
    played, restarts = _failing(monkeypatch, "round 1 eval", times=1)
    data = run_loop(config(), echo=lambda line: None)
    again = [(name, args) for name, args in played if name == "round 1 eval (threshold), again"]
    assert len(again) == 1 and restarts == [1]  # round 1's policy served again, then its failed episodes played again
    name, args = again[0]
    assert args[:4] == ["eval", "--resume", str(out / "round-01" / "eval" / "threshold"), "--retry-failed"]
    assert data["done"][-1] == "round 1 eval" and "| round 1 |" in (out / "results.md").read_text()


def test_episodes_that_fail_again_stop_the_loop_and_no_table_is_made_from_the_rest(world, monkeypatch):
    config, calls, crash, out = world
    played, restarts = _failing(monkeypatch, "round 1 eval", times=2)
    with pytest.raises(LoopError, match=r"round 1 eval \(threshold\), again: 2 of 6 episodes failed .* it failed "
                                        r"again after the server was restarted: the stage is not finished"):
        run_loop(config(), echo=lambda line: None)
    state = json.loads((out / "loop.json").read_text())
    assert "round 1 eval" not in state["done"] and "1" not in state["rounds"]  # not finished, not summarized
    assert "| round 1 |" not in (out / "results.md").read_text()  # the table shows what finished, nothing from the rest
    # The command, run again (the server back), resumes that stage and finishes.
    _failing(monkeypatch, "round 1 eval", times=0)
    data = run_loop(config(), echo=lambda line: None)
    assert data["done"][-1] == "round 1 eval" and "| round 1 |" in (out / "results.md").read_text()


@pytest.mark.parametrize("down", [True, False])
def test_a_stage_that_fails_with_the_server_dead_runs_again_on_a_restarted_server_and_a_crash_alone_stops(world, monkeypatch, down):
    config, calls, crash, out = world
    inner, played, restarts = loop.stages.run_stage, [], []

    def run_stage(name, args, out_file, *, tolerate_failed_episodes=True, **shown):
        played.append(name)
        if name == "round 1 collect":  # the check before the run found no server: no episode played, exit 2
            raise LoopError("round 1 collect failed (exit 2): cannot reach the server at http://127.0.0.1:9/v1")
        return inner(name, args, out_file, tolerate_failed_episodes=tolerate_failed_episodes, **shown)

    monkeypatch.setattr(loop.stages, "run_stage", run_stage)
    monkeypatch.setattr(loop.Serving, "down", lambda self: down)
    monkeypatch.setattr(loop.Serving, "restart", lambda self, r: restarts.append(r) or ("http://127.0.0.1:9/v1", f"round-{r}"))
    if down:  # the server died: restarted (round 0's policy collects round 1), and the stage run again, from its start
        data = run_loop(config(), echo=lambda line: None)
        assert restarts == [0] and played.count("round 1 collect, again") == 1 and data["done"][-1] == "round 1 eval"
    else:  # the server is up: a crash is a crash, and the loop stops at once
        with pytest.raises(LoopError, match="cannot reach the server"):
            run_loop(config(), echo=lambda line: None)
        assert restarts == [] and "round 1 collect, again" not in played


def test_a_long_stage_shows_its_progress_steps_with_their_time_and_episodes(tmp_path, monkeypatch):
    import sys

    # A stage that takes a while: the loop looks at it while it runs and shows what changed. The stand-in trainer
    # writes a step, then waits till the loop has shown it (the echo opens its gate): no race with a busy machine.
    (tmp_path / "ckpt").mkdir()
    metrics = tmp_path / "ckpt" / "metrics.jsonl"
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n"
                      f"printf '{{\"step\": 1, \"loss\": 2.0, \"seconds\": 3.0}}\\n' >> {metrics}\n"
                      f"while [ ! -f {tmp_path}/gate1 ]; do sleep 0.05; done\n"
                      f"printf '{{\"step\": 2, \"loss\": 1.0, \"seconds\": 5.0}}\\n' >> {metrics}\n"
                      f"while [ ! -f {tmp_path}/gate2 ]; do sleep 0.05; done\nexit 0\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    monkeypatch.setattr(loop.stages, "PROGRESS_EVERY", 0.05)
    shown: list[str] = []

    def echo(line: str) -> None:
        shown.append(line.split(" (")[0])
        (tmp_path / f"gate{len(shown)}").touch()

    loop.run_stage("round 0 sft", ["train"], tmp_path / "loop.out", tolerate_failed_episodes=False,
                   progress=loop.stages.train_progress(tmp_path / "ckpt", 120), echo=echo)
    assert shown == ["loop: round 0 sft: step 1/120, 3.0 s a step", "loop: round 0 sft: step 2/120, 4.0 s a step"]  # (3 + 5) / 2
    # A stage that plays episodes: the finished ones in its traces, out of all it plays.
    folder = tmp_path / "eval" / "train"
    folder.mkdir(parents=True)
    (folder / "greedy.jsonl").write_text('{"type":"episode_start"}\n{"type":"episode_end"}\n{"type":"episode_end"}\n')
    (folder / "eval.log.jsonl").write_text('{"type":"episode_end"}\n')  # a log, not a trace
    assert loop.stages.episodes_progress(tmp_path / "eval", 12)() == "2 of 12 episodes"
