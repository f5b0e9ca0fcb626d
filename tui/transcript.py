"""Recorded episodes as steps and lines: what the replay screen and ``replay --text`` show.

An episode's events are grouped into **steps**: a step is one message and the
violations, deals and notices it caused (the last step is ``episode_end``).
:func:`event_lines` turns one event into styled lines; the UI shows them as Rich
text, :func:`plain_transcript` joins them for a pipe. Every string from the trace
goes through :func:`~negotiate.tui.text.clean` first; the style strings are ours.
Traces are data, not code: a missing field shows as ``?``, never as a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from negotiate.errors import UserError
from negotiate.market import Market, MarketSpec
from negotiate.metrics import metrics_from_events, opt
from negotiate.trace import (
    DealEvent, EpisodeEnd, EpisodeRecord, Event, MessageEvent, NoticeEvent, Outcome, ViolationEvent, parse_event, read_episodes,
)

from negotiate.tui.text import action_label, clean, money, ratio

__all__ = ["FIELD_MAX", "cut", "Recorded", "load_trace", "check_scorable", "find_episode", "event_lines", "hang_width", "market_lines", "end_lines", "plain_transcript",
           "price_points"]

Line = tuple[str, str]
"""(Rich style, text): a line of a transcript."""

SELLER_STYLE = "bold yellow"
BUYER_STYLE = "bold cyan"
THOUGHT_STYLE = "dim italic"
DEAL_STYLE = "bold green"
VIOLATION_STYLE = "bold red"
NOTICE_STYLE = "dim"


FIELD_MAX = 4000
"""Characters of one free-text field (talk, thought, raw reply, error, notice) a transcript shows, the longest thought
a parsed message keeps: past it the field is cut with :func:`cut`'s marker (``replay --text --full`` prints it whole).
A 50 MB talk printed whole took 6.4 s and 312 MB; a 100 KB reply redrawn at each key took 1.4 to 2.7 s a key."""


def cut(value: object, limit: int | None = FIELD_MAX) -> str:
    """``value`` cleaned, and past ``limit`` characters cut with a marker saying how many were left out (None: whole).

    >>> cut("x" * 12, 5)
    'xxxxx … [7 more characters cut; replay --text --full prints them]'
    >>> cut("ab\x1bc", 5), cut("x" * 9, None)
    ('abc', 'xxxxxxxxx')
    """
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if limit is None or len(text) <= limit:
        return clean(text)
    return clean(text[:limit]) + f" … [{len(text) - limit:,} more characters cut; replay --text --full prints them]"


def _q(value: object) -> str:
    """A trace field as shown: cleaned, or ``?`` when the trace lacks it."""
    return "?" if value is None else clean(value)


@dataclass(frozen=True, eq=False)
class Recorded(EpisodeRecord):
    """One recorded episode (an :class:`~negotiate.trace.EpisodeRecord`), with its events grouped into steps."""

    @cached_property
    def steps(self) -> list[list[Event]]:
        """Step k: a message and what followed it; the last step holds ``episode_end``."""
        steps: list[list[Event]] = []
        for event in self.events[1:]:
            if not steps or isinstance(event, (MessageEvent, EpisodeEnd)):
                steps.append([event])
            else:
                steps[-1].append(event)
        return steps

    @property
    def id(self) -> str:
        return _q(self.start.episode)

    @property
    def market(self) -> dict:
        market = self.start.market
        return market if isinstance(market, dict) else {}

    @property
    def buyer_ids(self) -> list[str]:
        return [clean(b.get("id", "?")) for b in self.market.get("buyers", []) if isinstance(b, dict)]

    def opt(self) -> tuple[int, frozenset] | None:
        """OPT and one optimal matching, recomputed from the recorded market (None if it cannot be)."""
        try:
            market = Market.from_dict(MarketSpec.model_validate(self.start.spec), self.market)
            return opt(market)
        except Exception:  # an odd or newer trace: the replay goes on without OPT pairs
            return None


def load_trace(path: str | Path, *, allow_partial: bool = False, on_skip=None) -> list[Recorded]:
    """Every complete episode of a trace file; a missing, empty or truncated file is a UserError (a truncated one is
    not with ``allow_partial``: ``on_skip`` gets a line for each part dropped, as :func:`read_episodes` says); so is an
    episode id the file holds twice (``report``'s line: either copy could not be picked with ``--episode``)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.jsonl") if not p.name.endswith(".log.jsonl"))
        hint = f" (it holds {', '.join(found[:4])}{', ...' if len(found) > 4 else ''})" if found else ""
        raise UserError(f"is a folder; give one trace file{hint}", source=str(path))
    try:
        episodes = [Recorded(events) for events in read_episodes(path, allow_partial=allow_partial, on_skip=on_skip,
                                                                      unique=True)]  # an id twice: report's line
    except OSError as error:
        raise UserError(f"cannot read the trace ({error.strerror or error})", source=str(path)) from None
    if not episodes:
        raise UserError("holds no complete episode", source=str(path))
    return episodes


def check_scorable(episode: Recorded, source: str) -> None:
    """Refuse what ``report`` refuses: an episode that did not fail but whose metrics cannot be recomputed from its events
    (no spec, a market that is not one, a deal naming a buyer its market lacks), in report's line: ``FILE: episode ID:
    problem``. ``replay --text`` printed such an episode as ``budget ? turns``."""
    if episode.failed:  # report scores no failed episode either
        return
    try:
        metrics_from_events(episode.events)
    except (ValueError, UserError) as error:
        raise UserError(f"episode {episode.id}: {error}", source=source) from None


def find_episode(episodes: list[Recorded], episode_id: str | None, source: str = "") -> int:
    """Index of the episode called ``episode_id`` (the first when None); a UserError naming some that exist."""
    if episode_id is None:
        return 0
    for index, episode in enumerate(episodes):
        if episode.start.episode == episode_id:
            return index
    ids = [e.id for e in episodes]
    listed = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
    raise UserError(f"no such episode; the trace has {listed}", source=source or None, field="--episode", value=episode_id)


def _talk_lines(text: str, indent: str, limit: int | None) -> list[str]:
    return [f'{indent}"{line}"' if k == 0 else f"{indent} {line}" for k, line in enumerate(cut(text, limit).split("\n"))]


def event_lines(event: Event | dict, *, thoughts: bool = True, arrow: str = "->", limit: int | None = FIELD_MAX) -> list[Line]:
    """One trace event as styled lines (a message can take several: header, talk, thought, error); each free-text
    field cut at ``limit`` characters with a marker (:func:`cut`; None: whole)."""
    if isinstance(event, dict):
        event = parse_event(event)
    if isinstance(event, MessageEvent):
        sender = _q(event.sender)
        to = _q(event.to) or "all"  # the seller's end is addressed to no one in particular
        is_seller = sender == "seller"
        turn = event.turn
        head = f"t{turn:<3}" if is_seller and isinstance(turn, int) else "    "
        style = SELLER_STYLE if is_seller else BUYER_STYLE
        lines: list[Line] = [(style, f"{head} {sender} {arrow} {to}  {action_label(event.action)}")]
        if event.talk:
            lines += [("", line) for line in _talk_lines(event.talk, "       ", limit)]
        if thoughts and event.thought:
            thought = cut(event.thought, limit).split("\n")
            lines += [(THOUGHT_STYLE, ("       thought: " if k == 0 else "                ") + line) for k, line in enumerate(thought)]
        if event.valid is False:
            lines.append((VIOLATION_STYLE, f"       invalid: {cut(event.error or 'no reason given', limit)}"))
        if event.raw and event.action is None:
            raw = cut(event.raw, limit).split("\n")
            lines += [(NOTICE_STYLE, ("       raw: " if k == 0 else "            ") + line) for k, line in enumerate(raw[:6])]
        return lines
    if isinstance(event, DealEvent):
        price, cost, value = event.price, event.cost, event.value
        detail = ""
        if all(isinstance(x, int) for x in (price, cost, value)):
            detail = f" (seller +{price - cost}, buyer +{value - price})"
        return [(DEAL_STYLE, f"     DEAL {_q(event.buyer)} buys {_q(event.product)} at {money(clean(price))}{detail}")]
    if isinstance(event, ViolationEvent):
        return [(VIOLATION_STYLE, f"     VIOLATION by {_q(event.who)}: {_q(event.kind)}: {cut(event.detail, limit)}")]
    if isinstance(event, NoticeEvent):
        return [(NOTICE_STYLE, f"     notice {_q(event.to)}: {cut(event.text, limit)}")]
    if isinstance(event, EpisodeEnd):
        return end_lines(event)
    return [(NOTICE_STYLE, f"     ({clean(event.type)} event)")]


_HANG = re.compile(r" *(?:t\d+ +|(?:thought|invalid|raw): |\")?")


def hang_width(line: str) -> int:
    """Where a line's text starts, for its wrapped continuation to line up under: its indent, with a turn
    number, a ``thought:``/``invalid:``/``raw:`` label or a talk's opening quote.

    >>> [hang_width(s) for s in ("t12  seller -> b1  offer", '       "Hello', "       thought: fine", "END done", "     DEAL b1")]
    [5, 8, 16, 0, 5]
    """
    return _HANG.match(line).end()


def end_lines(end: EpisodeEnd) -> list[Line]:
    """The outcome and the final metrics of an episode."""
    outcome, reason = _q(end.outcome), _q(end.reason)
    lines: list[Line] = [(DEAL_STYLE if outcome != Outcome.FAILED else VIOLATION_STYLE,
                          f"END {outcome} ({reason}) after {_q(end.turns_used)} of {_q(end.budget)} turns")]
    if isinstance(end.metrics, dict):
        lines += [("bold", "     " + line) for line in metric_lines(end.metrics)]
    return lines


def metric_lines(m: dict) -> list[str]:
    """The headline metrics of an episode, a few short lines."""
    violations = m.get("violations") or {}
    count = sum(v for v in violations.values() if isinstance(v, int)) if isinstance(violations, dict) else "?"
    return [
        f"profit {money(m.get('profit'))} of OPT {money(m.get('opt'))}: profit/OPT {ratio(m.get('profit_ratio'))}",
        f"welfare {money(m.get('welfare'))}: welfare/OPT {ratio(m.get('welfare_ratio'))}, regret {clean(m.get('regret', '-'))}",
        f"deals {clean(m.get('deals', '?'))} (deal rate {ratio(m.get('deal_rate'))}), capture {ratio(m.get('capture'))}, buyer surplus {money(m.get('buyer_surplus'))}",
        f"valid rate {ratio(m.get('valid_rate'))}, seller violations {count}, turns/deal {ratio(m.get('turns_per_deal'), 1)}",
    ]


def market_lines(episode: Recorded) -> list[Line]:
    """The episode's labels and its full private information (replays see everything)."""
    s = episode.start
    labels = [f"episode {episode.id}"] + [f"{key} {clean(value)}" for key, value in
                                          (("split", s.split), ("shape", s.shape), ("tier", s.tier), ("seed", s.seed), ("seller", s.seller), ("buyers", s.buyers))
                                          if value is not None]
    market = episode.market
    lines: list[Line] = [("bold", " | ".join(labels)), ("", f"budget {clean(market.get('budget', '?'))} turns, values drawn from {clean(market.get('price_low', '?'))}-{clean(market.get('price_high', '?'))}")]
    buyers = [b for b in market.get("buyers", []) if isinstance(b, dict)]
    products = [p for p in market.get("products", []) if isinstance(p, dict)]
    width = max([len(clean(p.get("name", ""))) for p in products] + [4])
    lines.append(("bold", f"{'':4} {'name':<{width}} {'cost':>6} {'stock':>5} |" + "".join(f"{clean(b.get('id', '?')):>7}" for b in buyers)))
    for j, p in enumerate(products):
        values = "".join(
            f"{clean(b['values'][j]) if isinstance(b.get('values'), list) and j < len(b['values']) else '?':>7}" for b in buyers
        )
        lines.append(("", f"{clean(p.get('id', '?')):<4} {clean(p.get('name', '')):<{width}} {clean(p.get('cost', '?')):>6} {clean(p.get('stock', '?')):>5} |{values}"))
    best = episode.opt()
    if best is not None:
        pairs = ", ".join(f"{b}-{p}" for b, p in sorted(best[1])) or "none"
        lines.append(("", f"OPT {money(best[0])}: {pairs}"))
    return lines


def plain_transcript(episode: Recorded, *, full: bool = False) -> str:
    """The whole episode as plain text: no markup, no control characters, one event after another; a free-text field
    longer than :data:`FIELD_MAX` cut with a marker unless ``full``."""
    out = [text for _, text in market_lines(episode)]
    for step in episode.steps:
        for event in step:
            out += [text for _, text in event_lines(event, limit=None if full else FIELD_MAX)]
    return "\n".join(line.rstrip() for line in out) + "\n"


def price_points(steps: list[list[Event]]) -> tuple[dict[str, list[tuple[str, int]]], dict[str, tuple[str, int]]]:
    """Per buyer, the priced actions in time order as (kind, price); and each buyer's deal (product, price)."""
    points: dict[str, list[tuple[str, int]]] = {}
    deals: dict[str, tuple[str, int]] = {}
    for step in steps:
        for event in step:
            if isinstance(event, MessageEvent) and event.valid is not False:
                price = event.price
                if not isinstance(price, int) or isinstance(price, bool):
                    continue
                buyer = event.to if event.sender == "seller" else event.sender
                points.setdefault(clean(buyer), []).append((_q(event.kind), price))
            elif isinstance(event, DealEvent) and isinstance(event.price, int):
                deals[_q(event.buyer)] = (_q(event.product), event.price)
    return points, deals
