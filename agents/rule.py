"""The fixed rules over scripted moves: one seller that sends, in each state, one of its tools' messages.

A learned policy whose prompt shows scripted moves (the ``tools`` prompt shows the planner's and greedy's next
messages) is measured against the best rule that needs no learning over those moves (docs/experiments/
rule-baselines.md, issue 41). :class:`RuleSeller` is every such rule at once: its tools walk the episode as the
prompt's do (:class:`~negotiate.agents.llm.Adviser`: each decides on a copy of itself, then takes the message
actually sent where the regulator accepted it), and the kind of move its first tool proposes picks whose message
goes out. One class and a spec, not one class per rule: ``benchmarks/rules.py`` enumerates them all.

A lookup table is a rule too (``table=FILE``): a JSON object from a kind of state (:func:`state_of`: the first tool's
verdict, each tool's kind of move, whether they write to the same buyer, the turns left per active buyer) to the tool
whose message goes out there. ``benchmarks/hindsight.py`` fits one on its hindsight labels (which move did better, by
replaying the market), and the loop plays it beside the fixed rules: a model trained on those labels is measured
against the table the same labels make.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from negotiate.errors import UserError
from negotiate.protocol import Message
from negotiate.regulator import SellerObservation

from negotiate.agents.base import ScriptedAgent
from negotiate.agents.moves import Adviser
from negotiate.agents.planner import read_reason
from negotiate.agents.views.tools import TOOLS

__all__ = ["RuleSeller", "KINDS", "kind_of", "rules_over", "state_of", "read_table", "table_rule"]

KINDS = ("offer", "accept", "reject", "end", "wait")
"""The kinds of move a tool proposes: a seller action's kind, or ``wait`` (it would send nothing now)."""


def kind_of(message: Message | None) -> str:
    """The kind of move ``message`` is (one of :data:`KINDS`).

    >>> from negotiate.protocol import Action
    >>> kind_of(Message("seller", "b1", "", Action("offer", "p1", 300))), kind_of(None)
    ('offer', 'wait')
    """
    return "wait" if message is None else message.action.kind


def state_of(obs: SellerObservation, said: tuple) -> str:
    """A kind of state, as a lookup table keys it: the first tool's verdict (a ``reasons=1`` planner's: ``hold out``,
    ``take it``, ``offer``..., else ``none``), each tool's kind of move, whether every tool writes to the same buyer
    (``same``/``apart``), and the turns left per active buyer, capped at 4: what the ``tools`` prompt shows in so many
    words.

    >>> from negotiate.protocol import Action
    >>> from types import SimpleNamespace as O
    >>> obs = O(budget_left=9, buyers=[O(status="active"), O(status="active"), O(status="served")])
    >>> planner = Message("seller", "b1", "", Action("reject"), thought="b1 bids $90 (first bid, below cost); 9 turns for 2 buyers: hold out")
    >>> state_of(obs, (planner, Message("seller", "b1", "", Action("accept", "p1", 90))))
    'hold out/reject/accept/same/4'
    """
    first = said[0]
    reason = read_reason(first.thought) if first is not None and first.thought else None
    verdict = "none" if reason is None else "offer" if reason[2].startswith("offer p") else reason[2]
    same = first is not None and all(m is not None and m.to == first.to for m in said[1:])
    active = sum(1 for b in obs.buyers if b.status == "active")
    turns = min(obs.budget_left // max(active, 1), 4)
    return "/".join([verdict, *(kind_of(m) for m in said), "same" if same else "apart", str(turns)])


def read_table(path: str, names: list[str]) -> dict[str, str]:
    """A lookup table's file: a JSON object from a kind of state (:func:`state_of`) to the name of one of the tools
    ``names``. A ``ValueError`` names the file and what is wrong."""
    try:
        table = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"parameter table={path!r}: cannot read it ({error.strerror or error})") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"parameter table={path!r}: not JSON ({error})") from None
    if not isinstance(table, dict):
        raise ValueError(f"parameter table={path!r}: not a JSON object from kinds of state to tools")
    for state, tool in table.items():
        if tool not in names:
            raise ValueError(f"parameter table={path!r}: {state!r} names {tool!r}, not one of the tools; choose from {', '.join(names)}")
    return table


def _head(tools) -> str:
    return "rule?tools=" + "|".join(tool.replace("&", "%26") for tool in tools)


def table_rule(tools: tuple[str, ...], path: str) -> str:
    """The spec of the lookup table in ``path`` played over ``tools``.

    >>> table_rule(("planner?reasons=1", "greedy"), "runs/h/table-label.json")
    'rule?tools=planner?reasons=1|greedy&table=runs/h/table-label.json'
    """
    return f"{_head(tools)}&table={path}"


def rules_over(tools: tuple[str, ...]) -> list[str]:
    """The fixed rules a policy shown ``tools``' next messages is measured against (issue 41): each tool alone, and with
    two tools, keyed on either one's kind of move, the rules that send the other's message for one kind of move only,
    or for every kind but one (22 for two tools; ``benchmarks/rules.py`` ranks all 62 keyed on one kind). The tools are
    joined by ``|`` (a list of seller specs on the command line is split at its commas), and a tool with an ``&`` in its
    spec is written ``%26`` inside the rule's.

    >>> rules_over(("planner",))
    ['planner']
    >>> specs = rules_over(("a?x=1", "b"))
    >>> len(specs), specs[:3], specs[-1]
    (22, ['a?x=1', 'b', 'rule?tools=a?x=1|b&offer=b'], 'rule?tools=b|a?x=1&wait=b&else=a')
    """
    out = list(dict.fromkeys(tools))
    if len(tools) != 2:
        return out
    for first, other in (tools, tools[::-1]):
        mine, theirs = (tool.split("?")[0] for tool in (first, other))
        head = _head((first, other))
        out += [f"{head}&{kind}={theirs}" for kind in KINDS]
        out += [f"{head}&{kind}={mine}&else={theirs}" for kind in KINDS]
    return out


class RuleSeller(ScriptedAgent):
    """A fixed rule over scripted sellers (its tools, walking the episode): in each state, the message of the tool named
    for the kind of move the first tool proposes. ``tools`` are sellers that can follow, comma-separated (default
    ``planner?reasons=1,greedy``, the tools prompt's; ``|`` separates them too, as a list of sellers on the command line
    needs); ``offer``, ``accept``, ``reject``, ``end`` and ``wait`` (the first
    tool would send nothing) each name a tool, ``else`` the one for the kinds not named (default the first tool).
    ``rule?tools=greedy,planner?reasons=1&offer=greedy&else=planner`` offers as greedy, otherwise as the planner.

    A tool is named by its agent name, so two tools need two names; an ``&`` inside a tool's own spec is written
    ``%26`` (``tools=planner?reasons=1%26patience=2,greedy``). A bare ``rule`` plays as its first tool, the planner.
    ``table=FILE`` (:func:`read_table`) names the tool for each kind of state it holds, where the tools' messages differ;
    elsewhere the choices above decide.
    Every rule keyed on one tool's kind of move is one spec: ``benchmarks/rules.py`` enumerates those over the tools
    prompt's two. Where a tool's message is None (it would wait), the rule waits; a tool waits only while a buyer owes
    a reply.
    """

    name = "rule"
    choices = (*KINDS, "else")
    """The spec's keys that name a tool."""

    def __init__(self, spec: str, params: dict, tools: list):
        super().__init__(spec, params)
        self.adviser = Adviser(tools)
        """The tools walking the episode, in the spec's order."""
        names = [tool.name for tool in params["tools"]]
        picks = {kind: params.get(kind, params.get("else", names[0])) for kind in KINDS}
        self.pick = {kind: names.index(name) for kind, name in picks.items()}
        """Kind of move of the first tool -> the index of the tool whose message goes out."""
        self.table = {state: names.index(name) for state, name in params.get("table_of", {}).items()}
        """Kind of state (:func:`state_of`) -> the index of the tool whose message goes out there, before ``pick``."""

    @classmethod
    def parse_params(cls, params: dict, parse: Callable[[str], object], sellers: dict) -> dict:
        """The spec's parameters, read: ``tools`` parsed into seller specs by ``parse`` (default :data:`TOOLS`), each of
        a class in ``sellers`` that can follow; each choice the name of one of them. A ``ValueError`` names the key,
        its value and what it may be."""
        texts = params.get("tools", ",".join(TOOLS)).replace("|", ",").split(",")
        able = ", ".join(name for name, agent in sellers.items() if hasattr(agent, "follow"))
        tools = []
        for text in texts:
            try:
                tool = parse(text)
            except UserError as error:
                raise ValueError(f"parameter tools={params['tools']!r}: {error}") from None
            if not hasattr(sellers[tool.name], "follow"):
                raise ValueError(f"parameter tools={params['tools']!r}: {tool.name} cannot walk an episode beside another "
                                 f"seller; tools are {able}")
            tools.append(tool)
        names = [tool.name for tool in tools]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"parameter tools={params['tools']!r}: names {', '.join(twice)} twice; a choice names a tool "
                             "by its name, so each tool needs its own")
        for key in cls.choices:
            if key in params and params[key] not in names:
                raise ValueError(f"parameter {key}={params[key]!r} is not one of the tools; choose from {', '.join(names)}")
        table = {"table_of": read_table(params["table"], names)} if "table" in params else {}
        return {**params, "tools": tuple(tools), **table}

    @classmethod
    def create(cls, spec, params, *, market, seed):
        if "tools" not in params:
            raise ValueError("a rule's tools come from its spec: build it with negotiate.agents.parse_agent")
        return cls(spec, params, [tool.build(market, seed) for tool in params["tools"]])

    def decide(self, obs: SellerObservation) -> Message | None:
        said = self.adviser.advise(obs)
        said = said if isinstance(said, tuple) and not isinstance(said, Message) else (said,)
        moves = {None if m is None else (m.to, m.action) for m in said}  # where the tools differ only
        chosen = self.table.get(state_of(obs, said)) if self.table and len(moves) > 1 else None
        message = said[chosen if chosen is not None else self.pick[kind_of(said[0])]]
        self.adviser.follow(obs, message)
        return message

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        """Take ``message`` as the message sent on ``obs`` instead (a teacher's walk of another seller's episode)."""
        self.adviser.follow(obs, message)

    def describe(self) -> dict:
        params = {key: value for key, value in self.params.items() if key != "table_of"} | {
            "tools": [tool.text for tool in self.params["tools"]]}
        return {"kind": "scripted", "name": self.name, "spec": self.spec, "params": params}
