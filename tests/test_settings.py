"""One mechanism for a command's settings (``negotiate.settings``): the dataclass is the flags, the TOML file, ``--set``
and the help; later sources win (default, file, ``--set``, flag typed); bad input is one line naming where it came from."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.settings import add_settings, read_settings, setting, settings_from_args, to_toml
from negotiate.training.loop import LoopConfig
from negotiate.training.trainer import TrainConfig


@dataclass
class Toy:
    """A settings dataclass of every kind of field, two of them flags."""

    name: str = setting("a name", default="a", flag=True)
    count: int = setting("a count", default=1, flag=True)
    rate: float = setting("a rate", default=0.5)
    on: bool = setting("a switch", default=False)
    paths: tuple[str, ...] = setting("some paths", default=())
    limit: int | None = setting("a limit", default=None)

    def check(self) -> None:
        if self.count < 1:
            raise UserError("must be at least 1", field="--count", value=self.count)
        if self.rate < 0:
            raise UserError("must be 0 or more", field="--rate", value=self.rate)


def parse(argv: list[str]) -> Toy:
    parser = argparse.ArgumentParser()
    add_settings(parser, Toy, command="toy")
    return settings_from_args(Toy, parser.parse_args(argv), command="toy")


def test_a_value_comes_from_the_default_the_file_set_and_the_flag_the_last_winning(tmp_path):
    file = tmp_path / "toy.toml"
    file.write_text('name = "from-file"\ncount = 3\nrate = 2\non = true\npaths = ["x", "y"]\n')
    assert parse([]) == Toy()
    assert parse(["--config", str(file)]) == Toy(name="from-file", count=3, rate=2.0, on=True, paths=("x", "y"))
    assert parse(["--config", str(file), "--set", "count=4", "--set", "limit=7", "--set", "on=false"]) == Toy(
        name="from-file", count=4, rate=2.0, on=False, paths=("x", "y"), limit=7)
    # a flag typed wins over both, even where it says what the default says
    assert parse(["--config", str(file), "--set", "count=4", "--count", "1"]).count == 1
    # --set reads a bare word as a string: a path or a list of names needs no quotes
    assert parse(["--set", "name=specs/compact.toml", "--set", "paths=a"]) == Toy(name="specs/compact.toml", paths=("a",))


@pytest.mark.parametrize("argv, text, message", [
    (["--set", "count"], None, "--set: 'count': give KEY=VALUE"),
    (["--set", "cuont=2"], None, "--set: cuont: not a toy setting; choose from name, count, rate, on, paths, limit"),
    (["--set", "count=two"], None, "--set: count: 'two': must be an integer"),
    (["--set", "on=1"], None, "--set: on: 1: must be true or false"),
    (["--set", "count=2", "--set", "count=3"], None, "--set: 'count=3': is given twice"),
    (["--set", "count=0"], None, "--set: count: 0: must be at least 1"),  # check() refused what --set gave: --set is named
    (["--count", "0"], None, "--count: 0: must be at least 1"),
    ([], "rate = -1\n", "FILE: rate: -1.0: must be 0 or more"),
    ([], "rate = \n", "FILE: not valid TOML"),
    ([], "limit = 2.5\n", "FILE: limit: 2.5: must be an integer"),
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


@hypothesis_settings(max_examples=50, deadline=None)
@given(st.builds(TrainConfig, traces=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8),
                                              max_size=3).map(tuple),
                 lr=st.floats(min_value=1e-8, max_value=10), max_grad_norm=st.sampled_from([1.0, math.inf]),
                 out=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
                 max_steps=st.one_of(st.none(), st.integers(1, 10**6)), bf16=st.booleans()))
def test_a_config_written_as_toml_reads_back_equal(tmp_path_factory, train):
    # What the loop hands its training stage: the typed config, through a file, is the same config.
    file = tmp_path_factory.mktemp("toml") / "train.toml"
    file.write_text(to_toml(train), encoding="utf-8")
    assert TrainConfig(**read_settings(file, TrainConfig, command="train")) == train


@pytest.mark.parametrize("command, cls", [("train", TrainConfig), ("loop", LoopConfig)])
def test_train_and_loop_show_at_most_20_options_and_keys_lists_every_setting(command, cls, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = [line.split()[0].rstrip(",") for line in capsys.readouterr().out.splitlines() if line.startswith("  -")]
    assert 15 <= len(shown) <= 20 and {"--config", "--set", "--keys"} <= set(shown), shown
    with pytest.raises(SystemExit) as done:
        main([command, "--keys"])
    assert done.value.code == 0
    listed = [found[1] for line in capsys.readouterr().out.splitlines() if (found := re.match(r"[* ] (\w+) \(", line))]
    assert listed == [f.name for f in cls.__dataclass_fields__.values()]


# -- serve, collect and eval: the same mechanism over RunConfig and RunOptions ---------------------------------------------


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
])
def test_a_bad_run_setting_is_one_line_naming_the_file_or_set_and_the_key(tmp_path, capsys, text, argv, message):
    file = tmp_path / "collect.toml"
    file.write_text('seller = "greedy"\n' + text)
    assert main(["collect", "--config", str(file), *argv, "--quiet", "--out", str(tmp_path / "c")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message.replace("collect.toml", str(file)) in err, err
    assert not (tmp_path / "c").exists()


def test_play_takes_its_settings_by_the_same_mechanism(tmp_path, capsys):
    """play's flags are keys too (a ``play --web`` server's settings in a file); a typed flag wins, the rest keep their
    defaults; a bad value names the file and the key."""
    from pathlib import Path

    from negotiate.cli import PlaySettings, _parser
    from negotiate.settings import apply_command_settings

    file = tmp_path / "play.toml"
    file.write_text('role = "seller"\nbuyers = "concession"\nout = "games"\nport = 8123\n')
    args = _parser().parse_args(["play", "--config", str(file), "--port", "9000"])
    apply_command_settings(args, (PlaySettings,), "play", defaults=(PlaySettings,))
    assert (args.role, args.buyers, args.out, args.port, args.split, args.seed, args.web) == (
        "seller", "concession", Path("games"), 9000, "train", None, False)
    file.write_text('role = "referee"\n')
    assert main(["play", "--config", str(file)]) == 2
    assert f"{file}: role: 'referee': must be one of buyer, seller" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command", ["serve", "collect", "eval", "train", "loop", "play", "report", "replay"])
def test_every_command_with_settings_lists_them_with_keys_and_takes_config_and_set(command, capsys):
    """One mechanism for every command that has settings: ``--keys`` lists each one (flag or key only), and
    ``--config``/``--set`` are in its help."""
    with pytest.raises(SystemExit) as done:
        main([command, "--keys"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"negotiate {command}: every setting") and len(re.findall(r"^[ *] ?\S+ \(", out, re.M)) >= 4
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = capsys.readouterr().out
    assert "--config FILE" in help_text and "--set KEY=VALUE" in help_text
