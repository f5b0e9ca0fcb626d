"""Episodes played out synchronously, and forked at a seller decision: the exact replays of a market.

A replay asks what a move is worth in a state: send it, let a continuation seller play on, and read the profit at
the end. Scripted buyers are seeded functions of what they observe, so with the same seeds the replay is exact, and
it costs only the turns left, not the episode from its start: :meth:`~negotiate.regulator.EpisodeState.fork` copies
the state at the decision, :func:`fork_agents` the buyers and the seller (each with its own generator state), and
:func:`play_out` plays the copy to its end with no event loop. The teacher of the menu policy
(``negotiate.training.teacher``) and the rollout seller (``negotiate.agents.rollout``) both stand on it.

:func:`play_out` plays the game ``run_episode(..., fresh=True)`` plays with instant (scripted) agents: the seller is
asked only once every reply it is owed has landed, and each message is answered at once (``tests/test_rollout.py``
compares the two, deal for deal and event for event). It never awaits, so it holds the thread until the episode ends:
it is for replays (thousands a second on small markets), not for serving.
"""

from __future__ import annotations

import copy

from negotiate.protocol import Message, ParseFailure
from negotiate.regulator import EpisodeState
from negotiate.trace import EndReason, Outcome

__all__ = ["play_out", "fork_agents", "profit"]


def play_out(state: EpisodeState, seller, buyers: dict, *, first: Message | None = None, limit: int | None = None) -> EpisodeState:
    """Play ``state`` to its end in place, ``seller`` deciding (``decide(obs)``) and every buyer answering at once;
    returns ``state``. ``first``: the seller's next message, sent before ``seller`` is asked anything (the move a
    replay values; the seller should have taken it as sent, ``follow``). ``limit``: at most this many more seller
    turns (None: to the end), after which the state is left as it is, unfinished.

    Every agent must be instant (``decide``): a model cannot be asked here."""
    turns_at_start = state.turns_used
    pending = first
    while state.outcome is None:
        if limit is not None and state.turns_used - turns_at_start >= limit:
            break
        if state.budget_left > 0 and state.any_free():
            if pending is not None:
                decision, pending = pending, None
            else:
                decision = seller.decide(state.seller_observation())
            if decision is not None:
                to = state.seller_send(decision)
                if to is not None:
                    reply = buyers[to].decide(state.buyer_observation(to, decision))
                    state.buyer_reply(to, reply if reply is not None else ParseFailure("buyer gave no reply", ""))
                continue
            if not state.pending:
                state.finish(Outcome.TERMINATED, EndReason.SELLER_IDLE)
        elif not state.pending:
            if state.budget_left <= 0:
                state.finish(Outcome.TRUNCATED, EndReason.BUDGET)
            else:
                state.finish(Outcome.TERMINATED, EndReason.NO_BUYERS)
        else:  # a reply owed with every buyer instant cannot happen: each message was answered as it was sent
            raise RuntimeError(f"{state.pending} buyer(s) owe a reply in a synchronous play-out")
    return state


def fork_agents(seller, buyers: dict) -> tuple[object, dict]:
    """Copies of a seller and its buyers that play on as the originals would from here (their generators and
    beliefs included), the originals untouched."""
    return copy.deepcopy(seller), {buyer_id: copy.deepcopy(agent) for buyer_id, agent in buyers.items()}


def profit(state: EpisodeState) -> int:
    """The seller's profit so far: the sum of price less cost over the deals made."""
    return sum(deal.price - deal.cost for deal in state.deals)
