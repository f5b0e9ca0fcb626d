"""The menu: the seller's legal moves laid out by the runtime, one line and one letter each.

A model that writes its message in free text must redo the planner's arithmetic to name a good buyer, product and
price, and a 135M model does not (docs/experiments/planner-concession.md). The protocol's action is a small decision
space; the menu makes it explicit. At each seller decision :func:`build_menu` lists the legal moves the runtime
proposes, each once:

- the move of each of the tools walking the episode (:data:`TOOLS`: the planner, with its verdict, and greedy), tagged
  with the tool's name;
- the planner's offer three and six steps up and down the price grid ($27 and $54 on the train split);
- every free bidder's standing bid, accepted (where its product is in stock and the bid covers the cost);
- ``wait`` where a buyer owes a reply, and ``end``.

Offers are priced on a grid of :data:`GRID` steps across the public value range (:func:`snap`: the nearest grid price
at or above the product's cost); the planner with its prices snapped to the grid loses under 0.005 profit/OPT
(``benchmarks/menu_grid.py``). Accepts keep the bid's own price. Options are listed in one order whatever proposed
them (by buyer, kind of move, product, price from high to low; wait and end last), so a letter says nothing of which
tool proposed it: the tags do.

:func:`render_menu` is what a menu policy reads: the state in a few lines (turns, catalog, each buyer's status and its
latest exchange) and the options. Everything in it is in the seller's observation. The policy answers with a letter
(``negotiate.agents.menu_seller``); :meth:`Menu.message` turns the option into the four-part message, its thought
naming the option and its talk a template. :class:`MenuRule` is a fixed rule over the menu (always the planner's
option, or the one a step above it, ...), the baseline a menu policy is measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from negotiate.protocol import SELLER, Action, Message, Notice
from negotiate.regulator import ACTIVE, SERVED, GONE, SellerObservation

from negotiate.agents.base import ScriptedAgent
from negotiate.agents.moves import Adviser, _make
from negotiate.agents.planner import read_reason

__all__ = ["Move", "Option", "Menu", "build_menu", "render_menu", "snap", "grid_prices", "TOOLS", "TOOL_NAMES", "GRID",
           "STEPS", "LETTERS", "MenuRule", "PICKS"]

TOOLS = ("planner?reasons=1", "greedy")
"""The scripted sellers whose moves the menu always holds, in order: the planner (its ``reasons=1`` verdict tags its
option) and greedy."""
TOOL_NAMES = ("planner", "greedy")
"""Their names, as the menu's tags give them."""
GRID = 100
"""Price steps across the public value range (``price_high - price_low``): $9 steps on the train split. The planner
with its prices snapped to this grid loses under 0.005 profit/OPT (``benchmarks/menu_grid.py``, 3,000 compact markets
per buyer kind: -0.0023 ± 0.0029 against conceding buyers, +0.0020 ± 0.0022 against threshold ones; 50 steps lost
0.0061 ± 0.0032 against conceding buyers, whose asks one step up are priced to the dollar)."""
STEPS = (-6, -3, 3, 6)
"""Grid steps from the planner's offer to the other prices the menu offers on its pair: prices a policy can tell apart
(a step of the grid is finer than any choice that matters)."""
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""An option's letter; a menu has at most this many options (the tools' two moves, four neighbours, an accept per
free bidder, wait and end: 26 covers 18 bidders)."""
SHOWN = 6
"""Latest lines of each buyer's exchange the menu prompt shows (three rounds of offer and answer)."""
_KINDS = {"offer": 0, "accept": 1, "reject": 2, "wait": 3, "end": 4}


@dataclass(frozen=True, slots=True)
class Move:
    """One legal move: an action to a buyer, ``wait`` (send nothing until a reply lands) or ``end``."""

    kind: str
    """``offer``, ``accept``, ``reject``, ``wait`` or ``end``."""
    to: str | None = None
    product: str | None = None
    price: int | None = None

    def text(self) -> str:
        """The move as a menu line writes it.

        >>> Move("offer", "b2", "p1", 450).text(), Move("accept", "b1", "p3", 400).text(), Move("wait").text()
        ('offer b2 p1 $450', 'accept b1 p3 $400', 'wait')
        """
        if self.kind in ("offer", "accept"):
            return f"{self.kind} {self.to} {self.product} ${self.price}"
        return f"reject {self.to}" if self.kind == "reject" else self.kind

    def key(self) -> tuple:
        """The menu's order: by buyer, kind of move, product and price from high to low; wait and end last."""
        return (self.to is None, self.to or "", _KINDS[self.kind], self.product or "", -(self.price or 0))


@dataclass(frozen=True, slots=True)
class Option:
    move: Move
    tags: tuple[str, ...] = ()
    """Who proposed it: ``planner: hold out``, ``greedy``; none for the grid's neighbours, accepts, wait and end."""

    def line(self, letter: str) -> str:
        """``C: offer b1 p1 $520 (planner: hold out; greedy)``."""
        return f"{letter}: {self.move.text()}" + (f" ({'; '.join(self.tags)})" if self.tags else "")


def grid_prices(low: int, high: int, steps: int = GRID) -> list[int]:
    """The grid's prices across the public range, whole dollars, lowest first.

    >>> grid_prices(100, 1000, 4)
    [100, 325, 550, 775, 1000]
    """
    return sorted({low + round(k * (high - low) / steps) for k in range(steps + 1)})


def snap(price: float, cost: int, grid: list[int]) -> int:
    """The grid price nearest ``price`` among those at or above ``cost`` (the top of the range where none is).

    >>> snap(640, 300, [100, 325, 550, 775, 1000]), snap(200, 300, [100, 325, 550, 775, 1000])
    (550, 325)
    """
    legal = [p for p in grid if p >= cost] or [grid[-1]]
    return min(legal, key=lambda p: (abs(p - price), p))


def _step(price: int, k: int, cost: int, grid: list[int]) -> int | None:
    """The grid price ``k`` steps from ``price`` (itself on the grid), if it is on the grid and covers ``cost``."""
    at = grid.index(price) + k
    return grid[at] if 0 <= at < len(grid) and grid[at] >= cost else None


@dataclass(frozen=True)
class Menu:
    """A state's options, in the menu's order; option ``i`` has letter ``LETTERS[i]``."""

    options: tuple[Option, ...]
    grid: tuple[int, ...] = ()
    """The price grid its offers are on (:func:`grid_prices` of the state's public range)."""

    def __len__(self) -> int:
        return len(self.options)

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.options)]

    def lines(self) -> list[str]:
        return [option.line(letter) for letter, option in zip(LETTERS, self.options)]

    def index(self, move: Move) -> int | None:
        """The position of ``move`` on the menu, None where it is not there."""
        return next((i for i, option in enumerate(self.options) if option.move == move), None)

    def tagged(self, tool: str) -> int | None:
        """The position of the option ``tool`` (``planner``, ``greedy``) proposed."""
        return next((i for i, option in enumerate(self.options) if any(t.split(":")[0] == tool for t in option.tags)), None)

    def message(self, i: int) -> Message | None:
        """Option ``i`` as the seller's message (None for wait), its thought naming the option, its talk a template."""
        move = self.options[i].move
        thought = f"option {LETTERS[i]} of {len(self.options)}: {self.options[i].line(LETTERS[i])[3:]}"
        if move.kind == "wait":
            return None
        if move.kind == "end":
            return _make(Message, (SELLER, "", "That is all for today.", _make(Action, ("end", None, None)), thought))
        talk = {"offer": f"I can let you have {move.product} for ${move.price}.", "accept": f"Deal: {move.product} at ${move.price}.",
                "reject": "I cannot go that low."}[move.kind]
        return _make(Message, (SELLER, move.to, talk, _make(Action, (move.kind, move.product, move.price)), thought))


def move_of(message: Message | None, obs: SellerObservation, grid: list[int]) -> Move | None:
    """The legal move a tool's message is, its offer's price snapped to the grid; None where it is not a legal move
    (a tool never sends one; guarded all the same)."""
    if message is None:
        return Move("wait") if any(b.awaiting for b in obs.buyers) else Move("end")
    action = message.action
    if action.kind == "end":
        return Move("end")
    buyer = next((b for b in obs.buyers if b.id == message.to), None)
    if buyer is None or buyer.status != ACTIVE or buyer.awaiting:
        return None
    if action.kind == "reject":
        return Move("reject", buyer.id)
    product = next((p for p in obs.products if p.id == action.product), None)
    if product is None or product.stock <= 0:
        return None
    if action.kind == "accept":
        return Move("accept", buyer.id, product.id, action.price) if buyer.bid == (product.id, action.price) and action.price >= product.cost else None
    return Move("offer", buyer.id, product.id, snap(action.price, product.cost, grid))


def build_menu(obs: SellerObservation, said: tuple[Message | None, ...]) -> Menu:
    """The menu of ``obs``, ``said`` holding the tools' next messages (:data:`TOOLS`' order; None: the tool waits)."""
    grid = grid_prices(obs.price_low, obs.price_high, GRID)
    tags: dict[Move, list[str]] = {}
    for name, message in zip(TOOL_NAMES, said):
        move = move_of(message, obs, grid)
        if move is None:
            continue
        reason = read_reason(message.thought) if message is not None and message.thought else None
        tag = f"{name}: {'offer' if reason[2].startswith('offer p') else reason[2]}" if reason else name
        tags.setdefault(move, []).append(tag)
    planner = move_of(said[0], obs, grid) if said else None
    if planner is not None and planner.kind == "offer":
        cost = next(p.cost for p in obs.products if p.id == planner.product)
        for k in STEPS:
            price = _step(planner.price, k, cost, grid)
            if price is not None:
                tags.setdefault(Move("offer", planner.to, planner.product, price), [])
    stock = {p.id: (p.stock, p.cost) for p in obs.products}
    for b in obs.buyers:
        if b.status == ACTIVE and not b.awaiting and b.bid is not None:
            units, cost = stock.get(b.bid[0], (0, 0))
            if units > 0 and b.bid[1] >= cost:
                tags.setdefault(Move("accept", b.id, *b.bid), [])
    if any(b.awaiting for b in obs.buyers):
        tags.setdefault(Move("wait"), [])
    tags.setdefault(Move("end"), [])
    moves = sorted(tags, key=Move.key)[: len(LETTERS)]
    return Menu(tuple(Option(move, tuple(tags[move])) for move in moves), tuple(grid))


def _item(item, buyer: str) -> str | None:
    """One line of a buyer's exchange as the menu prompt shows it: ``offer p2 $757``, ``bid p2 $358``, ``no``."""
    if isinstance(item, Notice):
        return None
    action = item.action
    if item.sender == SELLER:
        if item.to != buyer:
            return None
        return {"offer": f"offer {action.product} ${action.price}", "accept": f"accept {action.product} ${action.price}",
                "reject": "reject"}.get(action.kind)
    if item.sender != buyer:
        return None
    return {"bid": f"bid {action.product} ${action.price}", "accept": "yes", "reject": "no", "quit": "quit"}.get(action.kind)


def _exchanges(obs: SellerObservation) -> dict[str, list[str]]:
    """Each buyer's exchange with the seller, oldest first, in the menu prompt's words (a refused message marked)."""
    out: dict[str, list[str]] = {b.id: [] for b in obs.buyers}
    last: list[str] | None = None
    for item in obs.history:
        if isinstance(item, Notice):
            if item.kind == "violation" and last:
                last[-1] += " (refused)"
            last = None
            continue
        who = item.to if item.sender == SELLER else item.sender
        line = _item(item, who) if who in out else None
        last = None
        if line is not None:
            out[who].append(line)
            last = out[who] if item.sender == SELLER else None
    return out


SYSTEM = "You are the seller. Pick the move that makes the most profit; answer with its letter."
"""The menu prompt's system message."""


def render_menu(obs: SellerObservation, menu: Menu) -> list[dict]:
    """The chat messages (system, user) a menu policy reads: the state in a few lines and the options. About 150
    tokens on the compact splits: every token is read at every decision, by models trained on many of them."""
    exchanges = _exchanges(obs)
    active = sum(1 for b in obs.buyers if b.status == ACTIVE)
    lines = [f"{obs.budget_left} turns left of {obs.budget}; {active} buyer{'s' * (active != 1)} active; "
             f"values ${obs.price_low}-${obs.price_high}"]
    lines += [f"{p.id}: cost ${p.cost}, {'sold out' if p.stock <= 0 else f'{p.stock} left'}" for p in obs.products]
    for b in obs.buyers:
        if b.status == SERVED:
            lines.append(f"{b.id} bought")
        elif b.status == GONE:
            lines.append(f"{b.id} left")
        else:
            shown = exchanges[b.id][-SHOWN:]
            lines.append(f"{b.id} {'waits' if b.awaiting else 'free'}" + (": " + ", ".join(shown) if shown else ""))
    lines += [line.replace(": ", " ", 1) for line in menu.lines()]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


# -- fixed rules over the menu -------------------------------------------------------------------


def _pick_tool(tool: str, step: int = 0) -> Callable[[Menu], int]:
    def pick(menu: Menu) -> int:
        at = menu.tagged(tool)
        if at is None:
            return len(menu) - 1  # every tool waits or ends: the menu's last option (end) or, before it, wait
        move = menu.options[at].move
        if step and move.kind == "offer":
            at_grid = menu.grid.index(move.price) + step
            if 0 <= at_grid < len(menu.grid):
                found = menu.index(Move("offer", move.to, move.product, menu.grid[at_grid]))
                return at if found is None else found
        return at
    return pick


PICKS: dict[str, Callable[[Menu], int]] = {
    "planner": _pick_tool("planner"), "greedy": _pick_tool("greedy"),
    **{f"{'up' if k > 0 else 'down'}{abs(k)}": _pick_tool("planner", k) for k in STEPS},
}
"""The fixed rules over the menu: always the option the planner (or greedy) proposed, or the planner's offer that many
grid steps up or down (``up3``, ``down6``; the planner's own option where it proposes no offer)."""


class MenuRule(ScriptedAgent):
    """A fixed rule over the menu: each state's menu is built as a menu policy's is, and the option ``pick`` names is sent
    (``planner``, ``greedy``, ``up3``: the planner's offer three grid steps up, ...). ``menu`` alone is the planner
    with its prices on the menu's grid."""

    name = "menu"
    defaults = {"pick": "planner"}

    def __init__(self, spec: str, params: dict, tools: list):
        super().__init__(spec, params)
        self.adviser = Adviser(tools)
        self.pick = PICKS[params.get("pick", "planner")]

    @classmethod
    def parse_params(cls, params: dict, parse, sellers: dict) -> dict:
        pick = params.get("pick", "planner")
        if pick not in PICKS:
            raise ValueError(f"parameter pick={pick!r}: choose from {', '.join(PICKS)}")
        return {**params, "tools": tuple(parse(tool) for tool in TOOLS)}

    @classmethod
    def create(cls, spec, params, *, market, seed):
        if "tools" not in params:
            raise ValueError("a menu rule's tools come from its spec: build it with negotiate.agents.parse_agent")
        return cls(spec, params, [tool.build(market, seed) for tool in params["tools"]])

    def decide(self, obs: SellerObservation) -> Message | None:
        menu = build_menu(obs, self.adviser.advise(obs))
        message = menu.message(self.pick(menu))
        self.adviser.follow(obs, message)
        return message

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        self.adviser.follow(obs, message)

    def describe(self) -> dict:
        return {"kind": "scripted", "name": self.name, "spec": self.spec, "params": {"pick": self.params.get("pick", "planner")}}
