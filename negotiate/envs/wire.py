"""Observations and actions as text: what crosses an environment's API.

An observation is the observer's own record (:func:`negotiate.regulator.observe`): a
:class:`~negotiate.regulator.SellerObservation` or :class:`~negotiate.regulator.BuyerObservation`. :func:`encode`
writes it as one line of ASCII JSON (non-ASCII escaped, so the text fits a printable-ASCII charset) and
:func:`decode` reads it back into the same record, field for field: a scripted agent deciding on the decoded
record decides as it would on the original (``tests/test_envs_pettingzoo.py`` plays whole episodes so).

An action is one four-part message in either wire form of :mod:`negotiate.protocol` (JSON or tagged text), read
once by :func:`decision` with the lenient parser the LLM agents use; what does not parse becomes a
:class:`~negotiate.protocol.ParseFailure`, which the regulator records as an invalid message. :func:`action_text`
writes a message in the JSON form.
"""

from __future__ import annotations

import json

from negotiate.protocol import BUYER, SELLER, Action, BuyerStatus, Generated, Message, Notice, ParseFailure, parse_lenient
from negotiate.regulator import BuyerObservation, BuyerView, ProductView, SellerObservation

__all__ = ["encode", "decode", "decision", "action_text", "SENT_NOTHING"]

SENT_NOTHING = ""
"""The action that sends nothing: the seller waits for a reply (with none owed the episode ends, ``seller_idle``);
a buyer that sends nothing has its silence taken as a reject."""


def _item(item: Message | Notice) -> dict:
    if isinstance(item, Notice):
        return {"notice": item.kind, "to": item.to, "text": item.text}
    return item.to_dict()


def _unitem(data: dict) -> Message | Notice:
    if "notice" in data:
        return Notice(data["to"], data["notice"], data["text"])
    action = data["action"]
    return Message(data["sender"], data["to"], data["talk"], Action(action["kind"], action["product"], action["price"]),
                   data["thought"])


def _pair(value) -> tuple[str, int] | None:
    return None if value is None else (value[0], value[1])


def encode(obs: SellerObservation | BuyerObservation) -> str:
    """The observation as one line of ASCII JSON; ``role`` says which record it is.

    >>> from negotiate.regulator import History
    >>> encode(SellerObservation(0, 10, 100, 1000, (ProductView("p1", "Tent", 120, 1),), (), (), History([])))
    '{"role":"seller","turns_used":0,"budget":10,"price_low":100,"price_high":1000,"products":[{"id":"p1","name":"Tent","cost":120,"stock":1}],"buyers":[],"new":[],"history":[]}'
    """
    products = [p._asdict() for p in obs.products]
    if isinstance(obs, SellerObservation):
        data = {"role": SELLER, "turns_used": obs.turns_used, "budget": obs.budget, "price_low": obs.price_low,
                "price_high": obs.price_high, "products": products,
                "buyers": [{**b._asdict(), "status": str(b.status)} for b in obs.buyers],
                "new": [_item(item) for item in obs.new], "history": [_item(item) for item in obs.history]}
    else:
        data = {"role": BUYER, "buyer": obs.buyer, "persona": obs.persona, "values": list(obs.values), "products": products,
                "offer": obs.offer, "bid": obs.bid, "message": None if obs.message is None else _item(obs.message),
                "rounds": obs.rounds, "thread": [_item(item) for item in obs.thread]}
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


def decode(text: str) -> SellerObservation | BuyerObservation:
    """The record :func:`encode` wrote (its history and thread as tuples, which compare equal to the originals)."""
    data = json.loads(text)
    products = tuple(ProductView(p["id"], p["name"], p["cost"], p["stock"]) for p in data["products"])
    if data["role"] == SELLER:
        return SellerObservation(
            data["turns_used"], data["budget"], data["price_low"], data["price_high"], products,
            tuple(BuyerView(b["id"], BuyerStatus(b["status"]), b["awaiting"], _pair(b["offer"]), _pair(b["bid"]))
                  for b in data["buyers"]),
            tuple(_unitem(item) for item in data["new"]), tuple(_unitem(item) for item in data["history"]))
    message = data["message"]
    return BuyerObservation(data["buyer"], data["persona"], tuple(data["values"]), products, _pair(data["offer"]),
                            _pair(data["bid"]), None if message is None else _unitem(message), data["rounds"],
                            tuple(_unitem(item) for item in data["thread"]))


def action_text(message: Message | None) -> str:
    """A message in the protocol's JSON form (:data:`SENT_NOTHING` for None): what :func:`decision` reads back.

    >>> action_text(Message("seller", "b1", "Yours for $450.", Action("offer", "p2", 450)))
    '{"thought": "", "to": "b1", "talk": "Yours for $450.", "action": {"kind": "offer", "product": "p2", "price": 450}}'
    """
    if message is None:
        return SENT_NOTHING
    return json.dumps({"thought": message.thought, "to": message.to, "talk": message.talk, "action": message.action.to_dict()})


def decision(action, who: str) -> Message | ParseFailure | Generated | None:
    """What ``who`` (``seller`` or a buyer id) decided, from an action: message text in either wire form, parsed here
    (clamps noted in the trace as an LLM agent's are), :data:`SENT_NOTHING`, or a decision an agent's ``act`` returns
    (a Message, ParseFailure, Generated or None), taken as it is.

    >>> decision('{"to": "b1", "talk": "", "action": {"kind": "offer", "product": "p1", "price": 300}}', "seller").action
    Action(kind='offer', product='p1', price=300)
    >>> decision("Action: [SHRUG]", "b1").reason
    "action 'shrug' is not one of bid, accept, reject, quit"
    """
    if action is None or isinstance(action, (Message, ParseFailure, Generated)):
        return action
    if not isinstance(action, str):
        return ParseFailure(f"an action is the message's text, not {type(action).__name__}", repr(action)[:500])
    if not action.strip():
        return None
    result, notes, reasoning = parse_lenient(action, SELLER if who == SELLER else BUYER, who)
    extra = {"clamped": notes} if notes else {}
    if reasoning:
        extra["reasoning"] = reasoning
    return Generated(result, action, extra) if extra else result
