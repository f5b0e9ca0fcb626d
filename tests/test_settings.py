"""One path for a command's settings (``negotiate.settings``): a dataclass of :func:`setting` fields is the flags, the
TOML file, ``--set``, ``--keys`` and the help; one function reads them (defaults, file, ``--set``, flag typed, the last
winning) into instances; one function reads a value; bad input is one line naming where it came from; every flag of
every command reaches the value it sets."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

import negotiate.cli as cli
import negotiate.cli_runs as cli_runs
from negotiate.cli import command_settings, main
from negotiate.errors import UserError
from negotiate.logs import configure
from negotiate.run import RunConfig, RunOptions
from negotiate.settings import (Flag, add_command_settings, command_flags, items_of, keys_lines, read_command, read_file,
                                read_value, setting, to_keys, to_toml)
from negotiate.training.learning import LearningConfig
from negotiate.training.loop import LoopConfig
from negotiate.training.trainer import TrainConfig

COMMANDS = tuple(command_settings())
"""Every command that has settings (export too, issue 51): each walk below takes each of them."""


@dataclass
class Toy:
    """A settings dataclass of every kind of value, two of them flags."""

    name: str = setting("a name", default="a")
    count: int = setting("a count", default=1, kind="int")
    rate: float = setting("a rate", default=0.5, kind="number", key_only=True)
    on: bool = setting("a switch", default=False, kind="switch", key_only=True)
    paths: tuple[str, ...] = setting("some paths", default=(), kind="list", key_only=True)
    limit: int | None = setting("a limit", default=None, kind="int", key_only=True)

    def check(self) -> None:
        if self.count < 1:
            raise UserError("must be at least 1", field="--count", value=self.count)
        if self.rate < 0:
            raise UserError("must be 0 or more", field="rate", value=self.rate)


def parse(argv: list[str]) -> Toy:
    parser = argparse.ArgumentParser()
    add_command_settings(parser, "toy", (Toy,))
    return read_command(parser.parse_args(argv), "toy", (Toy,)).of(Toy)


def test_a_value_comes_from_the_default_the_file_set_and_the_flag_the_last_winning(tmp_path):
    file = tmp_path / "toy.toml"
    file.write_text('name = "from-file"\ncount = 3\nrate = 2\non = true\npaths = ["x", "y"]\n')
    assert parse([]) == Toy()
    assert parse(["--config", str(file)]) == Toy(name="from-file", count=3, rate=2.0, on=True, paths=("x", "y"))
    assert parse(["--config", str(file), "--set", "count=4", "--set", "limit=7", "--set", "on=false"]) == Toy(
        name="from-file", count=4, rate=2.0, on=False, paths=("x", "y"), limit=7)
    # a flag typed wins over both, even where it says what the default says
    assert parse(["--config", str(file), "--set", "count=4", "--count", "1"]).count == 1
    # --set reads a bare word as a string: a path or a list of names needs no quotes, and a list is split at its commas
    assert parse(["--set", "name=specs/compact.toml", "--set", "paths=a"]) == Toy(name="specs/compact.toml", paths=("a",))
    assert parse(["--set", "paths=a, b"]).paths == ("a", "b")


@pytest.mark.parametrize("argv, text, message", [
    (["--set", "count"], None, "--set: 'count': give KEY=VALUE"),
    (["--set", "cuont=2"], None, "--set: cuont: not a toy setting; choose from name, count, rate, on, paths, limit"),
    (["--set", "count=two"], None, "--set: count: 'two': must be a whole number"),
    (["--count", "two"], None, "--count: 'two': must be a whole number"),  # typed, read by the same reader
    (["--set", "on=1"], None, "--set: on: 1: must be true or false"),
    (["--set", "count=2", "--set", "count=3"], None, "--set: 'count=3': is given twice"),
    (["--set", "count=0"], None, "--set: count: 0: must be at least 1"),  # check() refused what --set gave: --set is named
    (["--count", "0"], None, "--count: 0: must be at least 1"),
    (["--set", "paths=a,,b"], None, "--set: paths: 'a,,b': has an empty item between commas"),
    ([], "rate = -1\n", "FILE: rate: -1.0: must be 0 or more"),
    ([], "rate = \n", "FILE: not valid TOML"),
    ([], "limit = 2.5\n", "FILE: limit: 2.5: must be a whole number"),
    ([], 'paths = ["a", ""]\n', "FILE: paths: ['a', '']: must be a string of comma-separated items or a list of strings"),
])
def test_bad_input_is_one_line_naming_where_it_came_from(tmp_path, argv, text, message):
    if text is not None:
        file = tmp_path / "toy.toml"
        file.write_text(text)
        argv = ["--config", str(file), *argv]
        message = message.replace("FILE", str(file))
    with pytest.raises(UserError) as caught:
        parse(argv)
    assert str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize("kind, typed, toml, value", [
    ("int", "-3", -3, -3), ("count", "3", 3, 3), ("seed", "5", 5, 5), ("number", "2.5", 2.5, 2.5), ("number", "2", 2, 2.0),
    ("seconds", "0.5", 0.5, 0.5), ("shard", "2/3", "2/3", (2, 3)), ("list", " a, b", ["a", "b"], ("a", "b")),
    ("count", "1000000000", 10**9, 10**9), ("shard", "1/1000000000", "1/1000000000", (1, 10**9)),  # the bounds themselves
    ("path", "x/y", "x/y", Path("x/y")), ("text", " hi ", "hi", "hi"),
])
def test_one_reader_reads_a_value_typed_and_the_same_value_from_a_file(kind, typed, toml, value):
    flag = Flag("help", kind=kind)
    assert read_value(flag, typed, typed=True) == read_value(flag, toml) == value


@pytest.mark.parametrize("kind, toml, message", [
    ("count", 0, "must be at least 1"), ("count", "7", "must be a whole number"), ("count", 2.5, "must be a whole number"),
    ("seed", 2**64, "must be from 0 to 18446744073709551615"), ("seconds", math.inf, "must be a positive, finite number of seconds"),
    ("seconds", 0, "must be a positive, finite number of seconds"), ("shard", "3/2", "need 1 <= K <= N"),
    ("shard", 2, "must be K/N, like 2/8"), ("number", True, "must be a number"), ("switch", "yes", "must be true or false"),
    # issue 51: past a machine integer, an OverflowError or TypeError traceback (serve, eval, collect; --shard)
    ("count", 2**63, "must be at most 1,000,000,000"), ("count", 10**9 + 1, "must be at most 1,000,000,000"),
    ("int", 2**63, "must be from -9,223,372,036,854,775,807 to 9,223,372,036,854,775,807"),
    ("shard", "1/99999999999999999999", "need N <= 1,000,000,000"), ("count", True, "must be a whole number"),
])
def test_the_reader_says_what_a_value_is_not(kind, toml, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read_value(Flag("help", kind=kind), toml)


def test_one_list_rule_everywhere():
    """items_of: items stripped; an empty item between commas refused (it is most often a spec cut short), no text no
    item. eval's --split refused ``train,,shapes`` while train and loop dropped the blank: now every list reads so."""
    assert items_of(" train , shapes ") == ["train", "shapes"] and items_of("") == items_of("  ") == []
    for text in ("train,,shapes", "greedy,", ",greedy", " , "):
        with pytest.raises(UserError, match="has an empty item between commas"):
            items_of(text, "--split")
    for listed in (Flag("h", kind="list"), Flag("h", listed=True)):
        with pytest.raises(ValueError, match="has an empty item"):
            read_value(listed, "train,,shapes")
    parser = cli._parser()
    for command, argv in (("train", ["--set", "eval_splits=train,,shapes"]), ("loop", ["--eval-splits", "train,,shapes"]),
                          ("eval", ["--split", "train,,shapes"])):
        with pytest.raises(UserError, match="eval_splits: 'train,,shapes': has an empty item|--eval-splits: 'train,,shapes': has "
                                            "an empty item|--split: 'train,,shapes': has an empty item"):
            read_command(parser.parse_args([command, *argv]), command, command_settings()[command], check=False)


def test_train_traces_through_set_are_a_list_as_typed(tmp_path):
    """``train --set traces=a,b`` gave one item, ``('a,b',)``: a list setting is one rule wherever it is given."""
    parser = cli._parser()
    read = lambda *argv: read_command(parser.parse_args(["train", *argv]), "train", (TrainConfig,), check=False).of(TrainConfig)
    assert read("--set", "traces=a,b").traces == ("a", "b")
    assert read("--traces", "a,b").traces == read("--traces", "a", "b").traces == ("a", "b")
    file = tmp_path / "t.toml"
    file.write_text('traces = "a,b"\n')
    assert read("--config", str(file)).traces == ("a", "b")
    file.write_text('traces = ["a", "b"]\n')
    assert read("--config", str(file)).traces == ("a", "b")


@hypothesis_settings(max_examples=50, deadline=None)
@given(st.builds(TrainConfig, traces=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                                                      max_size=8).filter(lambda t: t.strip() == t and "," not in t),
                                              max_size=3).map(tuple),
                 lr=st.floats(min_value=1e-8, max_value=10), max_grad_norm=st.sampled_from([1.0, math.inf]),
                 out=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12).map(str.strip),
                 max_steps=st.one_of(st.none(), st.integers(1, 10**6)), bf16=st.booleans()))
def test_a_config_written_as_toml_reads_back_equal(tmp_path_factory, train):
    # What the loop hands its training stage: the typed config, through a file, is the same config.
    file = tmp_path_factory.mktemp("toml") / "train.toml"
    file.write_text(to_toml(train), encoding="utf-8")
    assert TrainConfig(**read_file(file, TrainConfig, command="train")) == train


@pytest.mark.parametrize("command, cls", [("train", TrainConfig), ("loop", LoopConfig)])
def test_train_and_loop_show_at_most_20_options_and_keys_lists_every_setting(command, cls, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = [line.split()[0].rstrip(",") for line in capsys.readouterr().out.splitlines() if line.startswith("  -")]
    assert 15 <= len(shown) <= 20 and {"--config", "--set", "--keys"} <= set(shown), shown
    with pytest.raises(SystemExit) as done:
        main([command, "--keys"])
    assert done.value.code == 0
    listed = re.findall(r"^  (\w+) \(", capsys.readouterr().out, re.M)
    assert listed == [f.name for f in cls.__dataclass_fields__.values()]


def test_train_and_loop_share_their_common_settings_as_one_typed_part():
    """TrainConfig and LoopConfig both are a LearningConfig: what the loop writes into every train stage is declared
    once. A field the loop declares again differs in its default only (and says why, in the source); the names that
    mean different things (out, split, eval_episodes, eval_buyers) are each class's own."""
    assert issubclass(TrainConfig, LearningConfig) and issubclass(LoopConfig, LearningConfig)
    shared = set(LearningConfig.__dataclass_fields__)
    assert {"model", "teacher", "action_weights", "prompt", "seed", "lora_r", "micro_batch", "bf16", "kl_beta", "threads", "fresh",
            "temperature", "max_tokens", "markets", "group", "eval_splits", "eval_seed"} == shared
    train, loop = TrainConfig(), LoopConfig()
    differ = {name: (getattr(train, name), getattr(loop, name)) for name in shared if getattr(train, name) != getattr(loop, name)}
    assert differ == {"bf16": (False, None), "temperature": (0.7, 1.0), "max_tokens": (96, 48), "markets": (64, 16),
                      "eval_splits": ("train", "specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml")}
    source = Path(sys.modules[LoopConfig.__module__].__file__).read_text()
    for name in ("bf16", "temperature", "max_tokens", "markets", "eval_splits"):  # each redeclared with a comment above it
        assert re.search(rf"\n    # [^\n]+\n(    # [^\n]+\n)*    {name}: ", source), name
    both = set(TrainConfig.__dataclass_fields__) & set(LoopConfig.__dataclass_fields__)
    assert both - shared == {"out", "split", "eval_episodes", "eval_buyers"}


# -- --keys: one format, wrapped, naming flags that exist -----------------------------------------------------------------


def _help_options(command: str, capsys) -> dict[str, str]:
    """Each option of ``negotiate COMMAND --help`` (every spelling) -> its help, joined onto one line."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out.split("options:")[1].split("exit codes:")[0]
    options, current = {}, []
    for line in text.splitlines():
        found = re.match(r"  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if found:
            current = [word.rstrip(",") for word in found[1].split() if word.startswith("-")]
            for spelled in current:
                options[spelled] = found[2] or ""
        elif current:
            for spelled in current:
                options[spelled] = (options[spelled] + " " + " ".join(line.split())).strip()
    return options


def _key_entries(text: str) -> list[tuple[str, str, str, list[str], str]]:
    """(key, what it takes, default, flags, help) of each setting ``--keys`` printed."""
    entries, lines = [], text.splitlines()[1:]
    while lines and not re.match(r"  \w", lines[0]):  # the header's own continuation
        lines.pop(0)
    for line in lines:
        if re.match(r"  \w", line):
            entries.append([line.strip()])
        else:
            entries[-1].append(line.strip())
    out = []
    for words in entries:
        joined = " ".join(words)
        found = re.fullmatch(r"(\w+) \((.+?); default (.+?)(?:; flag (--[\w-]+(?: or --[\w-]+)*))?\) ?(.*)", joined)
        assert found, joined
        out.append((found[1], found[2], found[3], found[4].split(" or ") if found[4] else [], found[5]))
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_keys_has_one_format_wraps_at_100_columns_and_names_flags_that_exist(command, capsys, monkeypatch):
    """Every command's --keys: one header, then each setting as ``key (what it takes; default D; flag --f)`` and its help;
    no line over 100 columns however wide the terminal (loop's ran to 369); every flag it names, in a setting's line or
    in any help, is an option of the command's --help (loop's named --legal, --grpo-steps, --action-weights and
    --round-epochs, which it refuses); and a default both show is the same (play's said 'none' and then 'greedy')."""
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main([command, "--keys"])
    text = capsys.readouterr().out
    assert text.startswith(f"negotiate {command}: every setting is a key of --config FILE and of --set KEY=VALUE")
    assert max(map(len, text.splitlines())) <= 100
    entries = _key_entries(text)
    classes = command_settings()[command]
    assert [key for key, *_ in entries] == [flag.key(name) for cls in classes for name, flag, _ in command_flags(cls, command)]
    options = _help_options(command, capsys)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
    assert named <= set(options), named - set(options)
    for key, takes, default, flags, _help in entries:
        assert takes and default
        for spelled in flags:
            shown = re.search(r"\(default: ([^()]*(?:\([^()]*\)[^()]*)*)\)$", options[spelled])
            assert shown is None or shown[1] == default, (spelled, shown and shown[1], default)


def test_keys_wraps_to_a_narrow_terminal_as_help_does():
    lines = keys_lines("loop", (LoopConfig,), width=60)
    assert max(map(len, lines)) <= 60 and len(lines) > 2 * len(LoopConfig.__dataclass_fields__)


# -- every flag reaches the value it sets ----------------------------------------------------------------------------------


VALUES = {("sellers", None): ("greedy,posted", ("greedy", "posted")), ("buyers", None): ("concession", "concession"),
          ("split", None): ("shapes", "shapes"), ("split", "eval"): ("train,shapes", None),
          ("executor", None): ("ray", "ray"), ("address", None): ("auto", "auto")}
"""Values a run command's checks take (the generic ones are for the kind of value)."""
BY_KIND = {"int": ("17", 17), "count": ("3", 3), "seed": ("5", 5), "number": ("0.25", 0.25), "seconds": ("12.5", 12.5),
           "shard": ("2/3", (2, 3)), "path": ("somewhere", Path("somewhere")), "list": ("x1,x2", ("x1", "x2")),
           "text": ("zz", "zz")}


def _walk(command: str):
    """(field, flag, its spelling, the argv that types it, the value it must set) of each flag of ``command``."""
    for cls in command_settings()[command]:
        for name, flag, default in command_flags(cls, command):
            if flag.key_only:
                continue
            spelled = flag.spelled(name)
            if flag.kind == "switch":
                assert default is False, f"{command} {spelled}: a switch turns a setting on"
                yield cls, name, [spelled], True
                continue
            text, value = VALUES.get((name, command)) or VALUES.get((name, None)) or (
                (next(c for c in flag.choices if c != default),) * 2 if flag.choices else BY_KIND[flag.kind])
            assert value != default, (command, name)
            yield cls, name, [spelled, text], value


@pytest.mark.parametrize("command", ["serve", "collect", "eval"])
def test_every_run_flag_reaches_the_run_the_command_plays(command, tmp_path, monkeypatch):
    """Each flag of serve, collect and eval, typed alone, is in the RunConfig the command prepares and saves, or the
    RunOptions it plays with (a field whose flag reached nothing was ignored without a word). Collect's --markets is
    markets, each played --group times (8 by default)."""
    seen = {}

    class Played(Exception):
        """Where the run would start playing."""

    def run_all(runs, options, quiet, *rest):
        seen["configs"], seen["options"] = [prepared.config for prepared, _ in runs], options
        raise Played

    monkeypatch.setattr(cli_runs, "_run_all", run_all)
    monkeypatch.setattr(cli_runs, "check_workers", lambda *a, **k: None)  # a guard (ray, local models), not where a value goes
    walked = 0
    for cls, name, argv, value in _walk(command):
        base = [] if name == "sellers" else ["--seller", "greedy"]
        with pytest.raises(Played):
            main([command, *base, *argv, "--out", str(tmp_path / f"{command}-{walked}"), "--quiet"])
        walked += 1
        if cls is RunOptions:
            assert getattr(seen["options"], name) == value, (command, argv)
            continue
        configs = seen["configs"]
        if command == "eval" and name == "split":
            assert [config.split for config in configs] == ["train", "shapes"]
            continue
        expected = {("collect", "episodes"): 3 * 8, ("collect", "group"): (3, 32 * 3)}.get((command, name), value)
        if isinstance(expected, tuple) and name == "group":
            assert (configs[0].group, configs[0].episodes) == expected
        else:
            assert all(getattr(config, name) == expected for config in configs), (command, argv, getattr(configs[0], name))
    assert walked == sum(not flag.key_only for cls in command_settings()[command] for _, flag, _ in command_flags(cls, command))
    configure(None, console_level=logging.WARNING)  # the log file the last run opened


@pytest.mark.parametrize("command", [command for command in COMMANDS if command not in ("serve", "collect", "eval")])
def test_every_flag_of_the_other_commands_reaches_its_setting(command, monkeypatch):
    """Each flag typed alone sets its field of the instance main() hands the command, and nothing else."""
    handed = {}

    def run(args, settings, console):
        handed["settings"] = settings
        return 0

    parser = cli._parser()
    positional = {"report": ["traces"], "replay": ["trace.jsonl"]}.get(command, [])
    for cls, name, argv, value in _walk(command):
        args = parser.parse_args([command, *positional, *argv])
        args.run = run
        settings = read_command(args, command, (cls,), check=False)
        assert args.run(args, settings, None) == 0 and handed["settings"] is settings
        instance = settings.of(cls)
        assert instance == type(instance)(**{name: value}), (command, argv)  # that field, and no other


def test_main_hands_each_command_the_settings_it_read(monkeypatch):
    """main() reads the settings once and hands the command the instances (it rebuilt a RunConfig field by field)."""
    from negotiate.cli import PlaySettings, ReplaySettings, ReportSettings
    from negotiate.settings import Settings
    from negotiate.training.export import ExportConfig
    from negotiate.training.teach import TeachConfig

    handed = {}
    for command in ("train", "loop", "teach", "play", "report", "replay", "export"):
        monkeypatch.setattr(cli, f"_{command}", lambda args, settings, console, command=command: handed.setdefault(command, settings)
                            and 0)
    monkeypatch.setattr(Settings, "check", lambda self, instance: None)
    for argv in (["train", "--lr", "0.5"], ["loop", "--rounds", "5"], ["teach", "--rounds", "5"], ["play", "--role", "seller"],
                 ["report", "traces", "--format", "csv"], ["replay", "trace.jsonl", "--text"],
                 ["export", "--traces", "t", "--reward", "profit"]):
        assert main(argv) == 0
    assert handed["train"].of(TrainConfig) == TrainConfig(lr=0.5) and handed["loop"].of(LoopConfig) == LoopConfig(rounds=5)
    assert handed["teach"].of(TeachConfig) == TeachConfig(rounds=5) and handed["play"].of(PlaySettings) == PlaySettings(role="seller")
    assert handed["report"].of(ReportSettings).format == "csv" and handed["replay"].of(ReplaySettings).text is True
    assert handed["export"].of(ExportConfig) == ExportConfig(traces=("t",), reward="profit")


def test_to_keys_gives_back_what_the_reader_reads():
    """What the loop writes for a stage (its typed settings as the command's keys) reads back to the same settings."""
    config = RunConfig(sellers=("greedy", "posted"), buyers="concession", split="shapes", episodes=12, group=3, seed=4,
                       shard=(2, 3), fresh=True)
    options = RunOptions(concurrency=5, max_inflight=7)
    keys = to_keys("collect", config, options)
    assert keys["markets"] == 4 and keys["seller"] == "greedy,posted" and keys["shard"] == "2/3" and "episodes" not in keys
    args = argparse.Namespace(set=[f"{key}={value!r}" if isinstance(value, str) else f"{key}={str(value).lower()}"
                                   for key, value in keys.items()])
    read = read_command(args, "collect", (RunConfig, RunOptions))
    assert read.of(RunConfig) == config and read.of(RunOptions) == options


# -- serve, collect and eval: the same path over RunConfig and RunOptions -------------------------------------------------


def _run_of(folder):
    from negotiate.runner import load_config

    config = load_config(folder).to_json()
    config.pop("run_id")
    return config


def test_serve_reads_its_settings_from_a_file_and_set_as_from_its_flags(tmp_path):
    """A run made from --config and --set is the run the same values typed make: the same run.json (but its id) and the
    same episodes; a flag typed wins over the file, --set over the file."""
    typed = ["serve", "--seller", "greedy,posted", "--buyers", "concession", "--split", "shapes", "--episodes", "3",
             "--seed", "5", "--fresh", "--quiet"]
    assert main([*typed, "--out", str(tmp_path / "typed")]) == 0
    file = tmp_path / "serve.toml"
    file.write_text('seller = ["greedy", "posted"]\nbuyers = "concession"\nsplit = "shapes"\nepisodes = 7\nseed = 9\n'
                    "concurrency = 4\n")
    assert main(["serve", "--config", str(file), "--set", "seed=5", "--set", "fresh=true", "--episodes", "3", "--quiet",
                 "--out", str(tmp_path / "file")]) == 0
    assert _run_of(tmp_path / "typed") == _run_of(tmp_path / "file")
    assert _run_of(tmp_path / "file")["episodes"] == 3 and _run_of(tmp_path / "file")["seed"] == 5
    for name in ("greedy.jsonl", "posted.jsonl"):
        ends = [[line for line in (tmp_path / run / name).read_text().splitlines() if '"episode_end"' in line] for run in ("typed", "file")]
        strip = [[re.sub(r'"wall_s":[0-9.e-]+', "", line) for line in lines] for lines in ends]
        assert len(ends[0]) == 3 and strip[0] == strip[1]


def test_collect_and_eval_take_the_keys_their_flags_name(tmp_path, capsys):
    """collect's episodes are --markets (a key ``markets``), eval's splits a list; --keys lists each command's keys."""
    file = tmp_path / "collect.toml"
    file.write_text('seller = "greedy"\nmarkets = 2\ngroup = 3\n')
    assert main(["collect", "--config", str(file), "--quiet", "--out", str(tmp_path / "c")]) == 0
    assert _run_of(tmp_path / "c")["episodes"] == 6 and _run_of(tmp_path / "c")["group"] == 3
    file = tmp_path / "eval.toml"
    file.write_text('seller = ["greedy", "posted"]\nsplit = ["train", "shapes"]\nepisodes = 2\n')
    assert main(["eval", "--config", str(file), "--quiet", "--out", str(tmp_path / "e")]) == 0
    assert {"shapes", "train"} <= {p.name for p in (tmp_path / "e").iterdir() if p.is_dir()}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["collect", "--keys"])
    keys = re.findall(r"^  (\w+) \(", capsys.readouterr().out, re.M)
    assert keys[:4] == ["seller", "buyers", "split", "markets"] and "episodes" not in keys and "fsync" in keys


@pytest.mark.parametrize("text, argv, message", [
    ("markets = 0\n", [], "collect.toml: markets: 0: must be at least 1"),
    ("episodes = 3\n", [], "collect.toml: episodes: not a collect setting; choose from seller, buyers, split, markets"),
    ('shard = "3/2"\n', [], "collect.toml: shard: '3/2': need 1 <= K <= N"),
    ("fresh = 1\n", [], "collect.toml: fresh: 1: must be true or false"),
    ("", ["--set", "seller_timeout=-1"], "--set: seller_timeout: -1: must be a positive, finite number of seconds"),
    ("markets = 2.5\n", [], "collect.toml: markets: 2.5: must be a whole number"),  # not rounded down to 2
    ('seed = "7"\n', [], "collect.toml: seed: '7': must be a whole number"),
    ("", ["--set", "shard=2"], "--set: shard: 2: must be K/N, like 2/8"),
    ("", ["--set", "shard=x/2"], "--set: shard: 'x/2': expected K/N, like 2/8"),
    ("", ["--set", "concurrency=abc"], "--set: concurrency: 'abc': must be a whole number"),
    ('split = ["train", "shapes"]\n', [], "collect.toml: split: ['train', 'shapes']: must be a string"),  # one split here
    ("", ["--markets", "two"], "--markets: 'two': must be a whole number"),  # typed: the same reader, the same line
])
def test_a_bad_run_setting_is_one_line_naming_the_file_or_set_and_the_key(tmp_path, capsys, text, argv, message):
    file = tmp_path / "collect.toml"
    file.write_text('seller = "greedy"\n' + text)
    assert main(["collect", "--config", str(file), *argv, "--quiet", "--out", str(tmp_path / "c")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message.replace("collect.toml", str(file)) in err, err
    assert not (tmp_path / "c").exists()


def test_play_takes_its_settings_by_the_same_path(tmp_path, capsys):
    """play's flags are keys too (a ``play --web`` server's settings in a file); a typed flag wins, the rest keep their
    defaults; a bad value names the file and the key."""
    from negotiate.cli import PlaySettings, _parser

    file = tmp_path / "play.toml"
    file.write_text('role = "seller"\nbuyers = "concession"\nout = "games"\nport = 8123\n')
    read = read_command(_parser().parse_args(["play", "--config", str(file), "--port", "9000"]), "play", (PlaySettings,))
    assert read.of(PlaySettings) == PlaySettings(role="seller", buyers="concession", out=Path("games"), port=9000)
    assert read.given["port"] == (9000, "--port") and read.given["buyers"] == ("concession", str(file))
    file.write_text('role = "referee"\n')
    assert main(["play", "--config", str(file)]) == 2
    assert f"{file}: role: 'referee': must be one of buyer, seller" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_with_settings_takes_config_set_and_keys(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--keys"])
    assert done.value.code == 0
    assert len(re.findall(r"^  \w+ \(", capsys.readouterr().out, re.M)) >= 4
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = capsys.readouterr().out
    assert "--config FILE" in help_text and "--set KEY=VALUE" in help_text


def test_every_settings_field_has_a_flag():
    """A field made without setting() would be read by nobody: command_flags refuses it."""
    @dataclass
    class Bare:
        x: int = 1

    with pytest.raises(TypeError, match="Bare.x is not a setting"):
        command_flags(Bare, "toy")


def test_the_generic_module_names_no_command_config():
    """negotiate/settings.py knows settings, not the commands that have them (it named a TrainConfig field)."""
    source = Path(sys.modules[read_command.__module__].__file__).read_text()
    for name in ("TrainConfig", "LoopConfig", "RunConfig", "TeachConfig", "PlaySettings"):
        assert name not in source, name


# -- the loop's defaults from any folder -----------------------------------------------------------------------------------


def test_the_loops_default_specs_are_found_from_another_folder(tmp_path):
    """``negotiate loop`` with its defaults names specs/compact*.toml; from a folder without them (a fresh process whose
    working directory is elsewhere), the config resolves them to the package's copies, the same files."""
    code = ("from negotiate.cli import _parser, command_settings; from negotiate.settings import read_command; "
            "import json, sys; args = _parser().parse_args(['loop', '--set', 'bf16=false']); "
            "config = read_command(args, 'loop', command_settings()['loop']).instances[0]; "
            "print(json.dumps([config.split, config.eval_splits]))")
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr

    split, held_out = json.loads(done.stdout)
    root = Path(__file__).resolve().parents[1]
    assert Path(split).is_absolute() and Path(split).read_text() == (root / "specs" / "compact.toml").read_text()
    assert [Path(path).name for path in held_out.split(",")] == ["compact.toml", "compact-correlated.toml", "compact-shapes.toml"]
    assert all(Path(path).read_text() == (root / "specs" / Path(path).name).read_text() for path in held_out.split(","))
    # from the checkout, the names stay as given: a run's settings do not change
    config = LoopConfig(bf16=False)
    config.check()
    assert (config.split, config.eval_splits) == ("specs/compact.toml", LoopConfig().eval_splits)


def test_serve_reads_a_shipped_spec_by_its_readme_path_from_another_folder(tmp_path):
    """The README's ``--split specs/compact.toml`` plays the package's copy from a folder without ``specs/`` (the trace
    names the compact split and its spec, 2 products); a spec that ships nowhere is still refused by name."""
    env = {**os.environ, "PYTHONPATH": ""}
    command = [sys.executable, "-m", "negotiate", "serve", "--seller", "greedy", "--split", "specs/compact.toml",
               "--episodes", "2", "--out", "traces", "--quiet"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    starts = [json.loads(line) for line in (tmp_path / "traces" / "greedy.jsonl").read_text().splitlines()
              if '"episode_start"' in line]
    assert len(starts) == 2
    assert all(start["split"] == "compact" and start["spec"]["products"] == 2 and len(start["market"]["products"]) == 2
               for start in starts)
    missing = subprocess.run([*command[:7], "specs/nowhere.toml", "--out", "other"], cwd=tmp_path, capture_output=True,
                             text=True, env=env, timeout=120)
    assert missing.returncode == 2 and "specs/nowhere.toml: no such spec file" in missing.stderr
    assert not (tmp_path / "other").exists()
