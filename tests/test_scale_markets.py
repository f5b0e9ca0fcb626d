"""Large markets (issue 44): the array paths of the scripted sellers play exactly what their loops played.

Greedy values its pairs as arrays from :data:`negotiate.agents.scripted.VECTOR_PAIRS` pairs on, and the planner keeps
each buyer's ladder until that buyer's bounds move; both must send, message for message, what the plain versions
send. The cost itself is measured by ``benchmarks/scale_markets.py``, not here.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from negotiate.agents import scripted
from negotiate.agents.moves import best_assigned
from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import MarketSpec, generate
from negotiate.run import build_buyers, seller_seed
from negotiate.trace import MessageEvent


def _messages(seller_spec: str, buyer_spec: str, spec: MarketSpec, seed: int) -> list[tuple]:
    market = generate(spec, seed)
    seller = parse_agent(seller_spec, "seller").build(market, seller_seed(market.seed))
    buyers = build_buyers(market, parse_agent(buyer_spec, "buyer"))
    episode = anyio.run(lambda: run_episode(market, seller, buyers, episode_id=f"scale-{seed}"))
    return [(e.sender, e.to, e.action.get("kind"), e.action.get("product"), e.action.get("price"))
            for e in episode.events if isinstance(e, MessageEvent)]


def _solved(value: np.ndarray, cols: list[int], units: list[int], free: int) -> tuple[int, int] | None:
    """``best_assigned`` as it was before issue 51: scipy's solver on every decision, its pairs read one by one."""
    expanded = [c for c, j in enumerate(cols) for _ in range(min(units[j], free))]
    rows, picks = linear_sum_assignment(value[:, expanded], maximize=True)
    best = None
    for r, k in zip(rows, picks):
        c = expanded[k]
        if value[r, c] > 0 and (best is None or value[r, c] > value[best]):
            best = (r, c)
    return best


def test_the_best_assigned_pair_is_the_one_the_solver_gives_ties_and_single_rows_and_columns_included():
    """Issue 51: one free buyer (or one unit) is answered without the solver, and the solver's pairs are read as
    arrays; ties between assignments (values drawn from a few levels, zeros, -0.0) go as the solver breaks them."""
    rng = np.random.default_rng(51)
    for trial in range(4000):
        rows = int(rng.choice([1, 1, 2, 3, 5, 9, 14]))
        units = [int(u) for u in rng.integers(0, 3 if trial % 2 else 2, int(rng.integers(1, 12)))]
        cols = [j for j, u in enumerate(units) if u > 0]
        if not cols:
            continue
        if trial % 4 == 3:
            cols = cols[:1]  # one product: one column, its units copied
        shape = (rows, len(cols))
        if trial % 3 == 0:
            value = rng.integers(0, 3, shape) * 150.0  # few levels: ties everywhere
        elif trial % 3 == 1:
            value = np.where(rng.random(shape) < 0.3, -0.0, rng.random(shape) * 300)
        else:
            value = np.round(rng.normal(0, 100, shape)) / 4
        assert best_assigned(value, cols, units, rows) == _solved(value, cols, units, rows), trial


@pytest.mark.parametrize("buyers", ["threshold", "concession", "mixed"])
@pytest.mark.parametrize("valuation", ["uniform", "correlated"])
def test_greedy_on_arrays_sends_what_its_loop_sends(monkeypatch, buyers, valuation):
    spec = MarketSpec(name="big", buyers=(6, 12), products=(6, 12), stock=2, valuation=valuation)
    for seed in range(4):
        arrays = _messages("greedy", buyers, spec, seed)
        with monkeypatch.context() as patch:
            patch.setattr(scripted, "VECTOR_PAIRS", 10**9)  # every market on plain lists, pair by pair
            loops = _messages("greedy", buyers, spec, seed)
        assert len(arrays) > 20 and arrays == loops, seed


@pytest.mark.parametrize("buyers", ["threshold", "concession", "mixed"])
@pytest.mark.parametrize("valuation", ["uniform", "correlated"])
def test_the_planner_keeping_ladders_sends_what_planning_every_row_sends(monkeypatch, buyers, valuation):
    from negotiate.agents.planner import PlannerSeller

    from negotiate.agents import planner

    spec = MarketSpec(name="big", buyers=(3, 8), products=(3, 8), stock=2, valuation=valuation)
    for seed in range(3):
        with monkeypatch.context() as patch:
            patch.setattr(planner, "CHUNK", 5)  # the first plan in several pieces (rows of 5 pairs or fewer: one row)
            kept = _messages("planner?reasons=1", buyers, spec, seed)
        with monkeypatch.context() as patch:
            # forget every row's ladders before each decision: every free row planned afresh, as before issue 44
            refresh = PlannerSeller._refresh
            patch.setattr(PlannerSeller, "_refresh",
                          lambda self, rows, need: (setattr(self, "_seen_lo", None), refresh(self, rows, need))[1])
            afresh = _messages("planner?reasons=1", buyers, spec, seed)
        assert len(kept) > 10 and kept == afresh, seed


def test_the_seller_loop_yields_by_the_clock_too_and_plays_the_same_episode(monkeypatch):
    """Issue 44: SIGTERM is taken at the seller loop's next yield; at 200 x 200 a turn takes milliseconds, and a yield
    every 100 turns (or none while the seller writes to 200 free buyers in a row) held SIGTERM for seconds. The loop
    also yields once YIELD_SECONDS have passed. Here a clock that moves a second per reading makes every turn late:
    the loop yields at every turn instead of every 100th, and the episode is the same."""
    import asyncio

    from negotiate import bus

    spec = MarketSpec(name="long", buyers=3, products=2, budget=400)
    sleep = asyncio.sleep
    yields = []

    async def counted(delay, *args):
        yields.append(delay)
        return await sleep(delay, *args)

    monkeypatch.setattr(bus.asyncio, "sleep", counted)
    steady = _messages("concession", "threshold", spec, 3)
    steady_yields = len(yields)
    clock = iter(range(10**9))
    monkeypatch.setattr(bus, "monotonic", lambda: float(next(clock)))
    yields.clear()
    late = _messages("concession", "threshold", spec, 3)
    assert late == steady and len(steady) > 300
    assert steady_yields <= len(steady) // bus.YIELD_TURNS + 2 and len(yields) >= len(steady) // 2 - 1


@pytest.mark.parametrize("seller,buyers", [("greedy", "concession"), ("greedy", "mixed"), ("planner", "mixed"),
                                           ("planner?reasons=1", "stubborn")])
def test_a_copy_of_a_large_market_seller_makes_the_move_the_original_made_and_replays_its_episode(seller, buyers):
    """Issue 51: what greedy and the planner keep between decisions on a large market (values, plans, which buyers
    spoke) is copied with them (``_STATE``): a copy made before a decision makes the original's move and, played on,
    reaches the original's end, though the original went on deciding (and changing what it keeps) after the copy."""
    from negotiate.regulator import EpisodeState
    from negotiate.rollout import fork_agents, play_out, profit
    from negotiate.runner import build_episode

    spec = MarketSpec(name="big", buyers=9, products=8, stock=2)
    market, agent, players = build_episode(spec, parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 3, 1)
    state = EpisodeState(market, episode="e")
    forks = []

    class Recording:
        instant = True

        def decide(self, obs):
            before = fork_agents(agent, players)
            message = agent.decide(obs)
            if len(forks) % 5 == 2:
                forks.append((state.fork(), before, obs, message))
            else:
                forks.append(None)
            return message

    play_out(state, Recording(), players)
    kept = [fork for fork in forks if fork is not None]
    assert len(forks) > 25 and len(kept) >= 5
    for fork, (seller_copy, buyers_copy), obs, message in kept:
        assert seller_copy.decide(obs) == message  # the copy, made before the decision, makes it too
        play_out(fork, seller_copy, buyers_copy, first=message)
        assert (fork.deals, fork.outcome, fork.turns_used, profit(fork)) == (state.deals, state.outcome, state.turns_used, profit(state))


@pytest.mark.parametrize("seller,buyers", [("greedy", "concession"), ("greedy", "threshold"), ("planner", "mixed"),
                                           ("planner", "threshold")])
def test_what_a_copy_shares_with_a_large_market_seller_no_later_decision_changes(seller, buyers):
    """``_Follower.__deepcopy__`` copies what ``_STATE`` names and shares the rest: every container a decision
    changes in place must be named there (issue 51 added greedy's kept values and the planner's spoken-since marks)."""
    import copy
    import pickle

    from negotiate.regulator import EpisodeState
    from negotiate.rollout import play_out
    from negotiate.runner import build_episode

    market, agent, players = build_episode(MarketSpec(name="big", buyers=10, products=9), parse_agent(seller, "seller"),
                                           parse_agent(buyers, "buyer"), 4, 2)
    shared = []

    class Copying:
        instant = True

        def decide(self, obs):
            if len(shared) < 12:  # the first decisions: all that follow may change what these copies share
                twin = copy.deepcopy(agent)
                shared.append([(name, value, pickle.dumps(value)) for name, value in vars(agent).items()
                               if isinstance(value, (list, dict, np.ndarray)) and vars(twin)[name] is value])
            return agent.decide(obs)

    play_out(EpisodeState(market, episode="e"), Copying(), players)
    assert shared and any(names for names in shared)
    for names in shared:
        for name, value, then in names:
            assert pickle.dumps(value) == then, f"{name} is shared with a copy and a later decision changed it"
