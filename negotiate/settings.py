"""One mechanism for a command's settings: a dataclass is the flags, the TOML file, ``--set`` and the help.

Each field of a settings dataclass is made with :func:`setting`: its help text and default, and whether it is also a
command-line flag (``flag=True``; ``--teacher-episodes`` for ``teacher_episodes``). Every field, flag or not, is a key
of the TOML file ``--config FILE`` reads and of ``--set KEY=VALUE``; ``--keys`` prints every key with its type, default
and help, so the file's schema is the dataclass and nothing else. A value comes from, last wins: the field's default,
the file, ``--set``, the flag typed. Bad input is one line naming the file (or ``--set``) and the key, or the flag.

The commands that learn (``negotiate train``, ``negotiate loop``) keep their flags few (the settings people change from
run to run); the rest are keys. TRL's nested config dataclasses and their ``HfArgumentParser`` are the model.

The commands that play (``serve``, ``collect``, ``eval``) share the fields of ``RunConfig`` and ``RunOptions``, and a
field reads differently in each (``--markets`` in ``collect`` for ``episodes``, a list of splits in ``eval``): such a
field's ``flag`` is a :class:`Flag` saying so, and :func:`add_command_settings` makes each command's flags and keys from
it (a key is the flag's name without its dashes: ``markets``, ``seller_timeout``), with the same ``--config``,
``--set`` and ``--keys``; :func:`apply_command_settings` puts the file's and ``--set``'s values where no flag was typed.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from negotiate.errors import UserError

__all__ = [
    "setting", "Setting", "settings_of", "items_of", "add_settings", "read_settings", "settings_from_args", "flag_of", "to_toml",
    "Flag", "READERS", "command_flags", "command_default", "flag_help", "add_command_settings", "apply_command_settings",
    "read_count", "read_seed", "read_seconds", "read_shard",
]


def setting(help: str, *, default=MISSING, flag: bool | Flag = False):
    """A settings field: its help text, its default, and whether it is a command-line flag too (every field is a key);
    a :class:`Flag` where the flag reads differently from one command to another."""
    return field(default=default, metadata={"help": help, "flag": flag})


# -- how a flag's text is read -----------------------------------------------------------------------------------------
# argparse names the flag itself ("argument --shard: ..."): each message says only what is wrong.


def read_shard(text: str) -> tuple[int, int]:
    """``K/N``: the K-th of N slices, 1 <= K <= N."""
    try:
        k, n = (int(part) for part in str(text).split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected K/N, like 2/8") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= K <= N")
    return k, n


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def read_int(text: str) -> int:
    """A whole number."""
    return _whole(text)


def read_count(text: str) -> int:
    """A whole number >= 1."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def read_seed(text: str) -> int:
    """A seed: a whole number that fits in 64 bits unsigned (what a trace's JSON keeps exactly)."""
    value = _whole(text)
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 to {2**64 - 1}")
    return value


def read_seconds(text: str) -> float:
    """A deadline in seconds: positive and finite (0, -1, nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number of seconds")
    return value


READERS = {"int": read_int, "seed": read_seed, "count": read_count, "seconds": read_seconds, "shard": read_shard, "path": Path}
"""How each kind of :class:`Flag` reads its value (``text``: as typed; ``switch``: present or not)."""

COMMANDS = ("serve", "collect", "eval")
"""The commands a :class:`Flag` belongs to unless it says otherwise."""


@dataclass(frozen=True)
class Flag:
    """How a setting reads on the command line of the commands that share it (``serve``, ``collect`` and ``eval``):
    the flag's help, and where a command differs, its own spelling, default or help (``per``)."""

    help: str
    commands: tuple[str, ...] = COMMANDS
    """The commands that take the flag."""
    name: str = ""
    """The flag (default: ``--field-name``); the parsed value, and the key, is the name without dashes."""
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    kind: str = "text"
    """How the value is read: ``text``, ``int``, ``seed`` (a whole number from 0 to 2**64 - 1), ``count`` (a whole
    number >= 1), ``seconds`` (positive and finite), ``shard`` (K/N), ``path`` or ``switch`` (present or not)."""
    choices: tuple[str, ...] = ()
    """The values a text setting may take (none: any)."""
    listed: bool = False
    """A comma-separated list (``--seller``, eval's ``--split``): a file may give it as a TOML list of strings."""
    default: object = None
    """The command's default, where it is not the field's."""
    shown: str | None = None
    """The default as the help words it (None: the default itself; "": not shown)."""
    per: tuple = ()
    """(command, {attribute: value}) pairs: what differs in that command."""

    def of(self, command: str) -> Flag:
        """The flag as ``command`` shows it."""
        changes = dict(self.per).get(command, {})
        return replace(self, per=(), **changes) if changes else self

    def spelled(self, field_name: str) -> str:
        return self.name or flag_of(field_name)

    def key(self, field_name: str) -> str:
        """The key of the setting in a ``--config`` file and in ``--set``: the flag without its dashes (``markets``)."""
        return self.spelled(field_name)[2:].replace("-", "_")


def command_flags(cls, command: str) -> list[tuple[str, Flag, object]]:
    """(field, flag, default) of each field of ``cls`` that ``command`` takes as a flag, in field order."""
    out = []
    for item in fields(cls):
        flag = item.metadata.get("flag")
        if not isinstance(flag, Flag) or command not in flag.commands:
            continue
        flag = flag.of(command)
        out.append((item.name, flag, flag.default if flag.default is not None else item.default))
    return out


def command_default(cls, name: str, command: str):
    """The default ``command`` gives the field ``name`` of ``cls``: its flag's there, else the field's."""
    for field_name, _, default in command_flags(cls, command):
        if field_name == name:
            return default
    return next(item.default for item in fields(cls) if item.name == name)


def flag_help(flag: Flag, default) -> str:
    """The help line of a flag: its help and the default it shows (``{default}`` places it inside the help)."""
    shown = str(default) if flag.shown is None else flag.shown
    if "{default}" in flag.help:
        return flag.help.format(default=shown)
    return f"{flag.help} (default: {shown})" if shown else flag.help


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
    return [Setting(f.name, str(f.type), f.default, f.metadata.get("help", ""), f.metadata.get("flag") is True) for f in fields(cls)]


def items_of(text: str) -> list[str]:
    """The items of a comma-separated setting (``--seller``, eval's ``--split``, ``eval_splits``), blanks dropped.

    >>> items_of(" train, shapes,,")
    ['train', 'shapes']
    """
    return [part.strip() for part in text.split(",") if part.strip()]


def flag_of(name: str) -> str:
    """The flag of a setting: ``eval_split`` -> ``--eval-split``."""
    return "--" + name.replace("_", "-")


def _with_default(help_text: str, default) -> str:
    return help_text if "(default:" in help_text or default in ("", ()) else f"{help_text} (default: {default})"


class _Keys(argparse.Action):
    """``--keys``: print every setting of the command (its lines, made when asked), then exit."""

    def __init__(self, option_strings, dest, lines=lambda: [], **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.lines = lines

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write("\n".join(self.lines()) + "\n")
        parser.exit(0)


def _file_arguments(parser: argparse.ArgumentParser, command: str, lines, set_help: str) -> None:
    """``--config FILE``, ``--set KEY=VALUE`` and ``--keys`` (printing ``lines()``): every command with settings has them."""
    parser.add_argument("--config", metavar="FILE", help=f"a TOML file of {command} settings (every key: --keys); flags typed "
                                                         "override it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    parser.add_argument("--keys", action=_Keys, lines=lines, help="print every setting with its default and help, and exit")


def add_settings(parser: argparse.ArgumentParser, cls, *, command: str) -> None:
    """``--config``, ``--set``, ``--keys`` and one flag per setting marked ``flag=True`` of ``cls``. A flag not typed stays
    out of the parsed arguments, so that the file's value, not the default, stands for it."""
    keys_only = [s.name for s in settings_of(cls) if not s.flag]

    def lines() -> list[str]:
        out = [f"negotiate {command}: every setting, a key of --config FILE and of --set KEY=VALUE (* also a flag: --key-name)"]
        for s in settings_of(cls):
            out += [f"{'*' if s.flag else ' '} {s.name} ({s.kind}; default {s.default!r})", f"    {s.help}"]
        return out

    _file_arguments(parser, command, lines, f"one setting, as a line of --config's file would give it (repeatable); the keys "
                                            f"that are no flag: {', '.join(keys_only)}")
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


def _known(data: dict, known, command: str, source: str):
    """(name, key, value) of each item of ``data`` (a TOML table): ``-`` and ``_`` alike, each a setting in ``known``
    and given once; one line naming ``source`` and the key otherwise."""
    seen = set()
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UserError(f"not {'an' if command[:1] in 'aeiou' else 'a'} {command} setting; choose from {', '.join(known)}",
                            source=source, field=key)
        if name in seen:
            raise UserError("is given twice (with - and with _)", source=source, field=key)
        seen.add(name)
        yield name, key, value


def _checked(cls, command: str, data: dict, source: str) -> dict:
    """``data`` (a TOML table) as field values of ``cls``: ``-`` and ``_`` alike, types checked, one line otherwise."""
    kinds = {s.name: s.kind for s in settings_of(cls)}
    values: dict = {}
    for name, key, value in _known(data, kinds, command, source):
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


def _toml_file(path: str | Path) -> dict:
    """The table of a TOML file given by ``--config``: one line naming the file otherwise."""
    given, path = str(path), Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read it ({error.strerror or error})", field="--config", value=given) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"not valid TOML ({error})", source=str(path)) from None


def read_settings(path: str | Path, cls, *, command: str) -> dict:
    """The settings in a TOML file (``teacher_episodes = 600`` or ``teacher-episodes = 600``), checked against ``cls``'s
    fields: a one-line :class:`UserError` naming the file, the key and the value otherwise. Relative paths in it are
    relative to where the command runs, as on the command line."""
    data = _toml_file(path)
    return _checked(cls, command, data, str(path))


def _set_pairs(items: list[str]) -> dict:
    """``--set KEY=VALUE`` items as raw values: each VALUE read as in a TOML file (``8``, ``true``, ``"x"``), or as a
    string where it is not a TOML value (``--set split=specs/compact.toml``)."""
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
    return data


def _read_set(items: list[str], cls, *, command: str) -> dict:
    return _checked(cls, command, _set_pairs(items), "--set")


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
    """A settings dataclass (or a command's settings as a dict of keys) as the TOML file that gives it back
    (:func:`read_settings`, ``--config``); None values are left out (a None field is its default's absence).

    >>> from negotiate.training.trainer import TrainConfig
    >>> text = to_toml(TrainConfig(traces=("a", "b"), lr=1e-3, max_steps=None))
    >>> "traces = [\\"a\\", \\"b\\"]" in text, "lr = 0.001" in text, "max_steps" in text
    (True, True, False)
    >>> to_toml({"seller": "greedy", "markets": 4, "max_inflight": None})
    'seller = "greedy"\\nmarkets = 4\\n'
    """
    items = config.items() if isinstance(config, dict) else ((f.name, getattr(config, f.name)) for f in fields(config))
    return "".join(f"{name} = {_toml_value(value)}\n" for name, value in items if value is not None)


# -- the commands that play: flags and keys shared by serve, collect and eval -------------------------------------------


def add_command_settings(parser: argparse.ArgumentParser, classes: tuple, command: str) -> None:
    """The flags ``command`` takes from the fields of ``classes`` (their :class:`Flag`), and ``--config``, ``--set`` and
    ``--keys`` over the same settings. Every such flag defaults to None, so that a value left out can be told from one
    typed: the file's or ``--set``'s value, else the command's default (:func:`command_default`), stands for it."""
    for cls in classes:
        for name, flag, default in command_flags(cls, command):
            options = {"dest": flag.key(name), "help": flag_help(flag, default), "default": None}
            if flag.kind == "switch":
                options["action"] = "store_true"
            else:
                options |= {"type": READERS.get(flag.kind, str), "metavar": flag.metavar, **({"choices": flag.choices} if flag.choices else {})}
            parser.add_argument(flag.spelled(name), *flag.aliases, **options)

    def lines() -> list[str]:
        out = [f"negotiate {command}: every setting, a key of --config FILE and of --set KEY=VALUE, and a flag (--key-name)"]
        for cls in classes:
            for name, flag, default in command_flags(cls, command):
                kind = ("true or false" if flag.kind == "switch" else " or ".join(flag.choices) if flag.choices
                        else "a list" if flag.listed else flag.metavar or flag.kind)
                shown = flag.shown or ("none" if default is None else _toml_value(default))
                out += [f"  {flag.key(name)} ({kind}; default {shown})",
                        f"    {flag.help.format(default=default) if '{default}' in flag.help else flag.help}"]
        return out

    _file_arguments(parser, command, lines, "one setting, as a line of --config's file would give it (repeatable)")


def _command_value(flag: Flag, value, source: str, key: str):
    """A value from a TOML file or ``--set`` as the flag would read it typed, of the TOML type the setting is (a whole
    number for a count, no string or fraction): one line naming ``source`` and ``key`` otherwise. A list setting takes a
    string, or a list of strings (``seller = ["greedy", "planner"]``)."""
    def fail(message: str) -> UserError:
        return UserError(message, source=source, field=key, value=value)

    if flag.kind == "switch":
        if isinstance(value, bool):
            return value
        raise fail("must be true or false")
    if flag.kind in ("text", "path"):
        if flag.listed and isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise fail("must be a string" + (" or a list of strings" if flag.listed else ""))
        if flag.choices and value not in flag.choices:
            raise fail(f"must be one of {', '.join(flag.choices)}")
        return Path(value) if flag.kind == "path" else value
    if flag.kind == "shard":
        good = isinstance(value, str)
    elif flag.kind == "seconds":
        good = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        good = isinstance(value, int) and not isinstance(value, bool)
    if not good:
        raise fail({"shard": "must be K/N, like 2/8", "seconds": "must be a number of seconds"}.get(flag.kind, "must be a whole number"))
    try:
        return READERS[flag.kind](value)
    except argparse.ArgumentTypeError as error:
        raise fail(str(error).removeprefix(repr(str(value) if flag.kind == "shard" else value)).strip(" :") or "is out of range") from None


def _command_checked(classes: tuple, command: str, data: dict, source: str) -> dict:
    flags = {flag.key(name): flag for cls in classes for name, flag, _ in command_flags(cls, command)}
    return {name: _command_value(flags[name], value, source, key) for name, key, value in _known(data, flags, command, source)}


def apply_command_settings(args: argparse.Namespace, classes: tuple, command: str, *, defaults: tuple = ()) -> None:
    """Put the values of ``--config FILE`` and ``--set`` on ``args`` for each setting whose flag was not typed (last wins:
    the file, ``--set``, the flag typed), then the command's default for each setting of ``defaults`` (classes) still
    unset. A bad file, key or value is one line naming it."""
    data = {}
    if getattr(args, "config", None) is not None:
        data = _command_checked(classes, command, _toml_file(args.config), str(args.config))
    data |= _command_checked(classes, command, _set_pairs(getattr(args, "set", None) or []), "--set")
    for key, value in data.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for cls in defaults:
        for name, flag, default in command_flags(cls, command):
            if getattr(args, flag.key(name)) is None:
                setattr(args, flag.key(name), default)
