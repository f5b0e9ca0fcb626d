"""One mechanism for a command's settings: a dataclass is the flags, the TOML file, ``--set`` and the help.

Each field of a settings dataclass is made with :func:`setting`: its help text and default, and whether it is also a
command-line flag (``flag=True``; ``--teacher-episodes`` for ``teacher_episodes``). Every field, flag or not, is a key
of the TOML file ``--config FILE`` reads and of ``--set KEY=VALUE``; ``--keys`` prints every key with its type, default
and help, so the file's schema is the dataclass and nothing else. A value comes from, last wins: the field's default,
the file, ``--set``, the flag typed. Bad input is one line naming the file (or ``--set``) and the key, or the flag.

The commands that learn (``negotiate train``, ``negotiate loop``) keep their flags few (the settings people change from
run to run); the rest are keys. TRL's nested config dataclasses and their ``HfArgumentParser`` are the model.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from negotiate.errors import UserError

__all__ = ["setting", "Setting", "settings_of", "add_settings", "read_settings", "settings_from_args", "flag_of", "to_toml"]


def setting(help: str, *, default=MISSING, flag: bool = False):
    """A settings field: its help text, its default, and whether it is a command-line flag too (every field is a key)."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True)
class Setting:
    """One field of a settings dataclass, as the command line and the TOML file see it."""

    name: str
    kind: str
    """The field's annotation as text: ``int``, ``float``, ``bool``, ``str``, ``tuple[str, ...]``, ``X | None``."""
    default: object
    help: str
    flag: bool


def settings_of(cls) -> list[Setting]:
    """The settings of ``cls``, in its fields' order."""
    return [Setting(f.name, str(f.type), f.default, f.metadata.get("help", ""), f.metadata.get("flag", False)) for f in fields(cls)]


def flag_of(name: str) -> str:
    """The flag of a setting: ``eval_split`` -> ``--eval-split``."""
    return "--" + name.replace("_", "-")


def _with_default(help_text: str, default) -> str:
    return help_text if "(default:" in help_text or default in ("", ()) else f"{help_text} (default: {default})"


class _Keys(argparse.Action):
    """``--keys``: print every setting of the command (flag or key only), then exit."""

    def __init__(self, option_strings, dest, cls=None, command="", **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.cls, self.command = cls, command

    def __call__(self, parser, namespace, values, option_string=None):
        lines = [f"negotiate {self.command}: every setting, a key of --config FILE and of --set KEY=VALUE "
                 "(* also a flag: --key-name)"]
        for s in settings_of(self.cls):
            lines.append(f"{'*' if s.flag else ' '} {s.name} ({s.kind}; default {s.default!r})")
            lines.append(f"    {s.help}")
        sys.stdout.write("\n".join(lines) + "\n")
        parser.exit(0)


def add_settings(parser: argparse.ArgumentParser, cls, *, command: str) -> None:
    """``--config``, ``--set``, ``--keys`` and one flag per setting marked ``flag=True`` of ``cls``. A flag not typed stays
    out of the parsed arguments, so that the file's value, not the default, stands for it."""
    keys_only = [s.name for s in settings_of(cls) if not s.flag]
    parser.add_argument("--config", metavar="FILE", help=f"a TOML file of {command} settings (every key: --keys); flags typed "
                                                         "override it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"one setting, as a line of --config's file would give it (repeatable); the keys that are no flag: "
                             f"{', '.join(keys_only)}")
    parser.add_argument("--keys", action=_Keys, cls=cls, command=command, help="print every setting with its default and help, and exit")
    for s in settings_of(cls):
        if not s.flag:
            continue
        if s.kind.startswith("tuple"):
            parser.add_argument(flag_of(s.name), nargs="+", default=argparse.SUPPRESS, metavar="PATH", help=s.help)
        elif s.kind in ("bool", "bool | None"):
            parser.add_argument(flag_of(s.name), action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=_with_default(s.help, s.default))
        else:
            convert = {"int": int, "int | None": int, "float": float}.get(s.kind, str)
            parser.add_argument(flag_of(s.name), type=convert, default=argparse.SUPPRESS, help=_with_default(s.help, s.default))


_WORDS = {"int": "an integer", "int | None": "an integer", "float": "a number", "bool": "true or false", "bool | None": "true or false",
          "tuple[str, ...]": "a list of strings"}


def _checked(cls, command: str, data: dict, source: str) -> dict:
    """``data`` (a TOML table) as field values of ``cls``: ``-`` and ``_`` alike, types checked, one line otherwise."""
    kinds = {s.name: s.kind for s in settings_of(cls)}
    values: dict = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in kinds:
            raise UserError(f"not a {command} setting; choose from {', '.join(kinds)}", source=source, field=key)
        if name in values:
            raise UserError("is given twice (with - and with _)", source=source, field=key)
        kind = kinds[name]
        if kind.startswith("tuple"):
            value = [value] if isinstance(value, str) else value
            good = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if good else value
        elif kind in ("bool", "bool | None"):
            good = isinstance(value, bool)
        elif kind in ("int", "int | None"):
            good = isinstance(value, int) and not isinstance(value, bool)
        elif kind in ("float", "float | None"):
            good = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if good else value
        else:
            good = isinstance(value, str)
        if not good:
            raise UserError(f"must be {_WORDS.get(kind, 'a string')}", source=source, field=key, value=value)
        values[name] = value
    return values


def read_settings(path: str | Path, cls, *, command: str) -> dict:
    """The settings in a TOML file (``teacher_episodes = 600`` or ``teacher-episodes = 600``), checked against ``cls``'s
    fields: a one-line :class:`UserError` naming the file, the key and the value otherwise. Relative paths in it are
    relative to where the command runs, as on the command line."""
    given, path = str(path), Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read it ({error.strerror or error})", field="--config", value=given) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"not valid TOML ({error})", source=str(path)) from None
    return _checked(cls, command, data, str(path))


def _read_set(items: list[str], cls, *, command: str) -> dict:
    """``--set KEY=VALUE`` items: each VALUE read as in a TOML file (``8``, ``true``, ``"x"``), or as a string where it
    is not a TOML value (``--set split=specs/compact.toml``)."""
    data: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError("give KEY=VALUE", field="--set", value=item)
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        name = key.strip().replace("-", "_")
        if name in data:
            raise UserError("is given twice", field="--set", value=item)
        data[name] = value
    return _checked(cls, command, data, "--set")


def settings_from_args(cls, args: argparse.Namespace, *, command: str):
    """An instance of ``cls`` from the parsed arguments: each field's default, replaced by ``--config``'s value, by
    ``--set``'s, by the flag typed. Its ``check()``, where it has one, runs; an error about a value the file or
    ``--set`` gave, not a flag typed, names that file or ``--set`` and the key."""
    from_file = read_settings(args.config, cls, command=command) if getattr(args, "config", None) is not None else {}
    from_set = _read_set(getattr(args, "set", None) or [], cls, command=command)
    typed = {s.name: getattr(args, s.name) for s in settings_of(cls) if s.flag and hasattr(args, s.name)}
    if "traces" in typed:
        typed["traces"] = tuple(str(p) for p in typed["traces"])
    config = cls(**(from_file | from_set | typed))
    check = getattr(config, "check", None)
    if check is not None:
        try:
            check()
        except UserError as error:
            name = (error.field or "").removeprefix("--").replace("-", "_")
            where = "--set" if name in from_set else args.config if name in from_file else None
            if where is not None and name not in typed:  # not a flag the user typed: name where the value came from
                raise UserError(f"{name}{str(error)[len(error.field):]}", source=where) from None
            raise
    return config


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if value == math.inf else "-inf" if value == -math.inf else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_toml(config) -> str:
    """A settings dataclass as the TOML file that gives it back (:func:`read_settings`); None values are left out (a
    None field is its default's absence).

    >>> from negotiate.training.trainer import TrainConfig
    >>> text = to_toml(TrainConfig(traces=("a", "b"), lr=1e-3, max_steps=None))
    >>> "traces = [\\"a\\", \\"b\\"]" in text, "lr = 0.001" in text, "max_steps" in text
    (True, True, False)
    """
    return "".join(f"{f.name} = {_toml_value(getattr(config, f.name))}\n" for f in fields(config) if getattr(config, f.name) is not None)
