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
