"""One path for a command's settings: a dataclass is the flags, the TOML file, ``--set``, ``--keys`` and the help.

Every field of a settings dataclass is made with :func:`setting`, which gives it a :class:`Flag`: its help, its default,
how its value is read (``kind``), and whether it is also a command-line flag (``key_only`` says it is not) and under
what spelling. Every field, flag or not, is a key of the TOML file ``--config FILE`` reads and of ``--set KEY=VALUE``
(the key is the flag's name without its dashes: ``--seller-timeout`` is ``seller_timeout``, collect's ``--markets`` is
``markets``). A value comes from, last wins: the default, the file, ``--set``, the flag typed.

One function reads them all, :func:`read_command`: it returns the instances of the command's classes (a
:class:`Settings`), which fields were given and where, and it runs each instance's ``check()``. One function reads a
value, :func:`read_value`, whether typed on the command line or given by the file or ``--set``. Bad input is one line
naming the file (or ``--set``, or the flag), the key and the value. ``--keys`` prints every key in one format for every
command (:func:`keys_lines`), wrapped as ``--help`` is. A list is read by one rule, :func:`items_of`.

A field that several commands share reads differently in each where its :class:`Flag` says so (``per``): ``--markets``
in ``collect`` for ``episodes``, a list of splits in ``eval``. The commands that learn keep their flags few (the
settings people change from run to run); the rest are keys. TRL's config dataclasses are the model.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import textwrap
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from negotiate.errors import UserError

__all__ = [
    "Flag", "setting", "Settings", "KINDS", "items_of", "read_value", "add_command_settings", "read_command", "read_file",
    "command_flags", "flag_help", "shown_default", "keys_lines", "spelling", "to_keys", "to_toml", "read_shard", "COUNT_MOST",
    "INT_MOST",
]

COUNT_MOST = 10**9
"""The most a count (``kind="count"``: episodes, markets, a group, workers...) and a shard's N may be, after scaling
(collect's markets times its group). Far past any run (10**9 episodes of a seller are days of play and terabytes of
trace), and far enough below 2**63 that what a run computes from counts (its jobs: sellers times episodes) stays a
machine integer: ``serve --episodes 2**63`` was an ``OverflowError`` traceback."""
INT_MOST = 2**63 - 1
"""The largest whole number a setting of ``kind="int"`` takes (the least is its negative): what a machine integer
holds, as numpy, torch and the JSON written back (orjson) need."""

KINDS = {
    "text": "text", "path": "a path", "list": "a list", "int": "a whole number", "count": f"a whole number, 1 to {COUNT_MOST:,}",
    "seed": "a seed, 0 to 2**64 - 1", "number": "a number", "seconds": "seconds", "shard": "K/N", "switch": "true or false",
}
"""How a setting's value is read (:func:`read_value`), and how ``--keys`` names it."""


@dataclass(frozen=True)
class Flag:
    """A setting as the command line and the TOML file see it: its help, how its value is read, and its spelling; where
    a command differs, that command's spelling, default or help (``per``)."""

    help: str
    kind: str = "text"
    """How the value is read: one of :data:`KINDS`. ``list``: comma-separated items (:func:`items_of`), or a TOML list
    of strings, held as a tuple; ``switch``: a flag present or not, ``true`` or ``false`` in a file."""
    commands: tuple[str, ...] | None = None
    """The commands that take the setting (None: every command that reads its class)."""
    key_only: bool = False
    """A key of ``--config`` and ``--set`` only, not a flag."""
    name: str = ""
    """The flag (default: ``--field-name``); the key is the name without dashes."""
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    """The values a text setting may take (none: any)."""
    listed: bool = False
    """A text setting that is a comma-separated list (eval's ``--split``, the loop's ``eval_splits``): each item is
    checked by :func:`items_of`, and a file may give a TOML list of strings; the value stays one text."""
    many: bool = False
    """A ``list`` flag that takes several arguments (``--traces a b``), each of them read by :func:`items_of`."""
    command_default: object = None
    """The command's default, where it is not the field's (None: the field's)."""
    shown: str | None = None
    """The default as ``--help`` and ``--keys`` word it (None: the default itself; "": ``--help`` leaves it out, as a
    switch's)."""
    scaled_by: str = ""
    """The field holds the value given times this other field's (collect's ``--markets`` gives markets; the field,
    ``episodes``, counts ``group`` episodes for each)."""
    per: tuple = ()
    """(command, {attribute: value}) pairs: what differs in that command."""

    def of(self, command: str) -> Flag:
        """The flag as ``command`` shows it."""
        changes = dict(self.per).get(command, {})
        return replace(self, per=(), **changes) if changes else self

    def spelled(self, field_name: str) -> str:
        return self.name or "--" + field_name.replace("_", "-")

    def key(self, field_name: str) -> str:
        """The key of the setting in a ``--config`` file and in ``--set``: the flag without its dashes (``markets``)."""
        return self.spelled(field_name)[2:].replace("-", "_")


def setting(help: str, *, default=MISSING, **flag):
    """A settings field: its default, and its :class:`Flag` (its help and ``flag``'s options)."""
    return field(default=default, metadata={"flag": Flag(help, **flag)})


def command_flags(cls, command: str) -> list[tuple[str, Flag, object]]:
    """(field, flag as ``command`` shows it, ``command``'s default) of each field of ``cls`` that ``command`` takes, in
    field order. Every field of a settings class has a :class:`Flag` (a test walks them)."""
    out = []
    for item in fields(cls):
        flag = item.metadata.get("flag")
        if flag is None:
            raise TypeError(f"{cls.__name__}.{item.name} is not a setting(): every settings field has a Flag")
        if flag.commands is not None and command not in flag.commands:
            continue
        flag = flag.of(command)
        out.append((item.name, flag, flag.command_default if flag.command_default is not None else item.default))
    return out


def spelling(classes, name: str, command: str) -> str:
    """How a person gives the setting ``name`` of ``command``: its flag (``--rounds``) where it is one, else its key
    (``sft_lr``: a line of ``--config``'s file, or ``--set sft_lr=...``)."""
    for cls in classes if isinstance(classes, tuple) else (classes,):
        for field_name, flag, _ in command_flags(cls, command):
            if field_name == name:
                return flag.key(field_name) if flag.key_only else flag.spelled(field_name)
    raise KeyError(name)


# -- reading a value -----------------------------------------------------------------------------------------------------


def items_of(text: str, field: str | None = None) -> list[str]:
    """The items of a comma-separated setting (``--seller``, eval's ``--split``, ``eval_splits``), each stripped. An empty
    item between commas (``greedy,``, ``a,,b``) is refused, not dropped: it is most often a spec cut short. No text (or
    only spaces) is no item.

    >>> items_of(" train, shapes")
    ['train', 'shapes']
    >>> items_of("")
    []
    >>> items_of("train,,shapes", "--split")
    Traceback (most recent call last):
    ...
    negotiate.errors.UserError: --split: 'train,,shapes': has an empty item between commas; give each item once, like a,b
    """
    items = [part.strip() for part in str(text).split(",")]
    if len(items) > 1 and not all(items):
        raise UserError(EMPTY_ITEM, field=field, value=text)
    return [item for item in items if item]


EMPTY_ITEM = "has an empty item between commas; give each item once, like a,b"


def _items(text: str) -> list[str]:
    """:func:`items_of`, its refusal a ValueError (the reader names the file or flag, the key and the value)."""
    try:
        return items_of(text)
    except UserError:
        raise ValueError(EMPTY_ITEM) from None


def read_shard(text: str) -> tuple[int, int]:
    """``K/N``: the K-th of N slices, 1 <= K <= N <= :data:`COUNT_MOST` (a ValueError saying what is wrong otherwise).

    >>> read_shard("2/8")
    (2, 8)
    >>> read_shard("1/99999999999999999999")
    Traceback (most recent call last):
    ...
    ValueError: need N <= 1,000,000,000
    """
    try:
        k, n = (int(part) for part in str(text).split("/"))
    except ValueError:
        raise ValueError("expected K/N, like 2/8") from None
    if not 1 <= k <= n:
        raise ValueError("need 1 <= K <= N")
    if n > COUNT_MOST:
        raise ValueError(f"need N <= {COUNT_MOST:,}")
    return k, n


def _from_text(kind: str, text: str):
    """A flag's text as the TOML value a file would give (a ValueError saying what it is not)."""
    if kind in ("int", "count", "seed"):
        try:
            return int(text)
        except ValueError:
            raise ValueError("must be a whole number") from None
    if kind in ("number", "seconds"):
        try:
            return float(text)
        except ValueError:
            raise ValueError("must be a number" + (" of seconds" if kind == "seconds" else "")) from None
    return text


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_value(flag: Flag, value, *, typed: bool = False):
    """``value`` as the setting holds it: typed on the command line (text, ``typed``), or given by a TOML file or
    ``--set`` (a TOML value: a count is a whole number there, not a string or a fraction). Raises ValueError with what is
    wrong; the caller names the file, the key and the value."""
    kind = flag.kind
    if kind not in KINDS:
        raise TypeError(f"unknown kind of setting {kind!r}")
    if typed:
        value = _from_text(kind, value)
    if kind == "switch":
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if kind == "list":
        if isinstance(value, str):
            return tuple(_items(value))
        if isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
            return tuple(v.strip() for v in value)
        raise ValueError("must be a string of comma-separated items or a list of strings")
    if kind in ("text", "path", "shard"):
        if flag.listed and isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise ValueError({"shard": "must be K/N, like 2/8"}.get(kind, "must be a string" + (" or a list of strings" if flag.listed else "")))
        value = value.strip()
        if kind == "shard":
            return read_shard(value)
        if flag.listed:
            _items(value)  # refused here, where an item is empty
        if flag.choices and value not in flag.choices:
            raise ValueError(f"must be one of {', '.join(flag.choices)}")
        return Path(value) if kind == "path" else value
    if kind in ("int", "count", "seed"):
        if not (isinstance(value, int) and not isinstance(value, bool)):
            raise ValueError("must be a whole number")
        if kind == "count" and not 1 <= value <= COUNT_MOST:
            raise ValueError("must be at least 1" if value < 1 else f"must be at most {COUNT_MOST:,}")
        if kind == "int" and not -INT_MOST <= value <= INT_MOST:
            raise ValueError(f"must be from {-INT_MOST:,} to {INT_MOST:,}")
        if kind == "seed" and not 0 <= value < 2**64:
            raise ValueError(f"must be from 0 to {2**64 - 1}")
        return value
    if not _is_number(value):
        raise ValueError("must be a number" + (" of seconds" if kind == "seconds" else ""))
    if kind == "seconds" and not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive, finite number of seconds")
    return float(value)


# -- how a setting is shown ----------------------------------------------------------------------------------------------


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


def shown_default(flag: Flag, default) -> str:
    """The default as ``--help`` and ``--keys`` both word it: the flag's ``shown``, else the value as typed (a list
    comma-separated, a switch true or false, no value "none")."""
    if flag.shown:
        return flag.shown
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple) and flag.kind == "shard":
        return "/".join(map(str, default))
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    if isinstance(default, str) and not default:
        return '""'
    return str(default)


def _help_text(flag: Flag, default) -> str:
    return flag.help.format(default=shown_default(flag, default)) if "{default}" in flag.help else flag.help


def flag_help(flag: Flag, default) -> str:
    """The help line of a flag: its help and the default it shows (``{default}`` places it inside the help; a ``shown``
    of "" leaves it out)."""
    text = _help_text(flag, default)
    if "{default}" in flag.help or flag.shown == "":
        return text
    return f"{text} (default: {shown_default(flag, default)})"


def _width() -> int:
    """The width ``--keys`` wraps to: argparse's (the terminal's, less 2), at most 100 columns."""
    return max(40, min(100, shutil.get_terminal_size().columns - 2))


def keys_lines(command: str, classes: tuple, width: int | None = None) -> list[str]:
    """What ``--keys`` prints: each setting of ``command`` as ``key (what it takes; default D; flag --f)`` and its help
    below, wrapped to ``width`` (:func:`_width`)."""
    width = width or _width()
    wrap = lambda text, first, rest: textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                                                   break_on_hyphens=False)
    out = wrap(f"negotiate {command}: every setting is a key of --config FILE and of --set KEY=VALUE; a setting that is also "
               f"a flag names it", "", "    ")
    for cls in classes:
        for name, flag, default in command_flags(cls, command):
            takes = " or ".join(flag.choices) if flag.choices else KINDS[flag.kind] + (", comma-separated" if flag.listed else "")
            where = "" if flag.key_only else f"; flag {' or '.join((flag.spelled(name), *flag.aliases))}"
            out += wrap(f"{flag.key(name)} ({takes}; default {shown_default(flag, default)}{where})", "  ", "      ")
            out += wrap(_help_text(flag, default), "      ", "      ")
    return out


# -- the parser: flags, --config, --set, --keys --------------------------------------------------------------------------


class _Keys(argparse.Action):
    """``--keys``: print every setting of the command (its lines, made when asked), then exit."""

    def __init__(self, option_strings, dest, lines=lambda: [], **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.lines = lines

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write("\n".join(self.lines()) + "\n")
        parser.exit(0)


def add_command_settings(parser: argparse.ArgumentParser, command: str, classes: tuple) -> None:
    """The flags ``command`` takes from the fields of ``classes``, and ``--config``, ``--set`` and ``--keys`` over every
    setting. A flag not typed stays out of the parsed arguments, so that the file's or ``--set``'s value, else the
    default, stands for it (:func:`read_command`)."""
    keys_only = []
    for cls in classes:
        for name, flag, default in command_flags(cls, command):
            if flag.key_only:
                keys_only.append(flag.key(name))
                continue
            options = {"dest": name, "help": flag_help(flag, default), "default": argparse.SUPPRESS}
            if flag.kind == "switch":
                options["action"] = "store_true"
            else:  # the text typed, read with the file's and --set's values (read_command): one reader, one kind of error
                options["metavar"] = flag.metavar or ("{" + ",".join(flag.choices) + "}" if flag.choices else flag.key(name).upper())
                if flag.many:
                    options["nargs"] = "+"
            parser.add_argument(flag.spelled(name), *flag.aliases, **options)
    parser.add_argument("--config", metavar="FILE", help=f"a TOML file of {command} settings (every key: --keys); flags typed "
                                                         "override it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one setting, as a line of --config's file would give it (repeatable)"
                             + (f"; the keys that are no flag: {', '.join(keys_only)}" if keys_only else ""))
    parser.add_argument("--keys", action=_Keys, lines=lambda: keys_lines(command, classes),
                        help="print every setting with its default and help, and exit")


# -- the one reader ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """A command's settings as read: an instance of each of its classes, and which fields were given, with the value
    as given and where (a file's path, ``--set``, or the flag typed)."""

    command: str
    instances: tuple
    given: dict = field(default_factory=dict)
    """Field name -> (the value as given, before ``scaled_by``; where it came from: a file, ``--set``, the flag)."""
    typed: frozenset = frozenset()
    """The fields whose flag was typed (the last word on them)."""

    def of(self, cls):
        """The instance of ``cls``."""
        return next(instance for instance in self.instances if type(instance) is cls)

    def check(self, instance) -> None:
        """Run ``instance.check()`` (where it has one); an error about a value a file or ``--set`` gave, not a flag
        typed, is said again naming that file or ``--set`` and the key."""
        check = getattr(instance, "check", None)
        if check is None:
            return
        try:
            check()
        except UserError as error:
            name = (error.field or "").removeprefix("--").replace("-", "_")
            if not error.field or name not in self.given or name in self.typed:
                raise
            raise UserError(f"{name}{str(error)[len(error.field):]}", source=self.given[name][1]) from None


def _toml_file(path: str | Path) -> dict:
    """The table of a TOML file given by ``--config``: one line naming the file otherwise."""
    given, path = str(path), Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read it ({error.strerror or error})", field="--config", value=given) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"not valid TOML ({error})", source=str(path)) from None


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
        name = key.strip()
        if name.replace("-", "_") in (k.replace("-", "_") for k in data):
            raise UserError("is given twice", field="--set", value=item)
        data[name] = value
    return data


def _read_table(data: dict, flags: dict, command: str, source: str) -> dict:
    """``data`` (a TOML table) as field values: ``-`` and ``_`` alike in keys, each a setting of ``command`` given once,
    each value read by :func:`read_value`; one line naming ``source``, the key and the value otherwise."""
    seen: dict = {}
    for key, value in data.items():
        found = flags.get(key.replace("-", "_"))
        if found is None:
            raise UserError(f"not {'an' if command[:1] in 'aeiou' else 'a'} {command} setting; choose from {', '.join(flags)}",
                            source=source, field=key)
        name, flag = found
        if name in seen:
            raise UserError("is given twice (with - and with _)", source=source, field=key)
        try:
            seen[name] = (read_value(flag, value), source)
        except ValueError as error:
            raise UserError(str(error), source=source, field=key, value=value) from None
    return seen


def _keyed(command: str, classes: tuple) -> dict:
    return {flag.key(name): (name, flag) for cls in classes for name, flag, _ in command_flags(cls, command)}


def read_file(path: str | Path, classes, *, command: str) -> dict:
    """The settings in a TOML file as field values (``teacher_episodes = 600`` or ``teacher-episodes = 600``), each read
    as its flag reads it (:func:`read_value`): a one-line :class:`UserError` naming the file, the key and the value
    otherwise. Relative paths in it are relative to where the command runs, as on the command line."""
    classes = classes if isinstance(classes, tuple) else (classes,)
    return {name: value for name, (value, _) in _read_table(_toml_file(path), _keyed(command, classes), command, str(path)).items()}


def read_command(args: argparse.Namespace, command: str, classes: tuple, *, check: bool = True) -> Settings:
    """The settings of ``command`` from its parsed arguments: for each class, every field's default (the command's),
    replaced by ``--config``'s value, by ``--set``'s, by the flag typed; a field ``scaled_by`` another is multiplied by it.
    With ``check``, each instance's ``check()`` runs, where it has one; an error about a value the file or ``--set``
    gave, not a flag typed, names that file or ``--set`` and the key."""
    keyed = _keyed(command, classes)
    given: dict = {}
    config = getattr(args, "config", None)
    if config is not None:
        given |= _read_table(_toml_file(config), keyed, command, str(config))
    given |= _read_table(_set_pairs(getattr(args, "set", None) or []), keyed, command, "--set")
    present, typed = vars(args), set()
    for name, flag in keyed.values():
        if flag.key_only or name not in present:
            continue
        text = present[name]
        try:
            if flag.kind == "switch":  # present: on
                value = True
            elif flag.many:  # --traces a b,c: each argument's items, in order
                value = tuple(item for part in text for item in read_value(flag, part, typed=True))
            else:
                value = read_value(flag, text, typed=True)
        except ValueError as error:
            raise UserError(str(error), field=flag.spelled(name), value=" ".join(text) if flag.many else text) from None
        given[name] = (value, flag.spelled(name))
        typed.add(name)
    instances = []
    for cls in classes:
        values = {name: default for name, _, default in command_flags(cls, command)}
        values |= {name: value for name, (value, _) in given.items() if name in values}
        for name, flag, _ in command_flags(cls, command):
            if flag.scaled_by:
                values[name] = values[name] * values[flag.scaled_by]
        instances.append(cls(**values))
    settings = Settings(command, tuple(instances), given, frozenset(typed))
    if check:
        for instance in instances:
            settings.check(instance)
    return settings


def to_keys(command: str, *instances) -> dict:
    """The settings of ``instances`` as ``command``'s keys, each value as its flag takes it (a list comma-separated, a
    shard as K/N, a scaled field divided back): what :func:`read_command` reads back to the same instances. A setting
    that is None is left out (None is its default's absence)."""
    values = {}
    for instance in instances:
        for name, flag, _ in command_flags(type(instance), command):
            value = getattr(instance, name)
            if value is None:
                continue
            if flag.scaled_by:
                value = value // getattr(instance, flag.scaled_by)
            elif flag.kind == "list":
                value = ",".join(value)
            elif flag.kind == "shard":
                value = "/".join(map(str, value))
            elif flag.kind == "path":
                value = str(value)
            values[flag.key(name)] = value
    return values


def to_toml(config) -> str:
    """A settings dataclass (or a command's settings as a dict of keys, :func:`to_keys`) as the TOML file that gives it
    back (``--config``); None values are left out (a None field is its default's absence).

    >>> @dataclass
    ... class Run:
    ...     traces: tuple = ()
    ...     lr: float = 1e-4
    ...     max_steps: int | None = None
    >>> print(to_toml(Run(traces=("a", "b"), lr=1e-3)), end="")
    traces = ["a", "b"]
    lr = 0.001
    >>> to_toml({"seller": "greedy", "markets": 4, "max_inflight": None})
    'seller = "greedy"\\nmarkets = 4\\n'
    """
    items = config.items() if isinstance(config, dict) else ((f.name, getattr(config, f.name)) for f in fields(config))
    return "".join(f"{name} = {_toml_value(value)}\n" for name, value in items if value is not None)
