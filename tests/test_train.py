"""negotiate.training: rewards, the dataset from traces, advantages, the losses, TRL's GRPO step, checkpoints.

Always run: rewards, the replay of scripted episodes into prompts and completions, the
groups of ``negotiate collect``, advantages worked out by hand. With torch, transformers and
peft (``pip install 'negotiate[train]'``): a tiny llama model built here (a tokenizer trained on
the spot), one thread, float32: SFT lowers the loss of what it trains on, one offline-GRPO step
moves log-probs in the sign of the advantage, a TRL GRPO step through the rollout function,
and a saved checkpoint reloads as an ``hf:`` seller that plays an episode.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections import Counter

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from negotiate.agents.llm import render_seller, render_seller_compact
from negotiate.agents.planner import read_reason
from negotiate.agents.registry import parse_agent
from negotiate.cli import main
from negotiate.episode import run_episode
from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, Market, Product, generate
from negotiate.protocol import SELLER, render_tagged
from negotiate.trace import read_episodes
from negotiate.training.dataset import (
    DataFilter, Episode, _tally_reasons, advantages, decisions, group_key, load_episodes, replay, teacher_agreement, teacher_decisions,
)
from negotiate.training.rewards import REWARDS, profit_penalized, profit_share, reward_fn

from tiny_model import build_tiny_llama, small_market

HAVE_TRAIN = all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "peft"))
HAVE_TRL = HAVE_TRAIN and importlib.util.find_spec("trl") is not None and importlib.util.find_spec("datasets") is not None
needs_train = pytest.mark.skipif(not HAVE_TRAIN, reason="needs the train extra: pip install 'negotiate[train]'")


def play(seller: str = "greedy", buyers: str = "threshold", market=None, seed=0) -> list[dict]:
    market = market or small_market()
    s = parse_agent(seller, "seller").build(market, [seed, 2])
    b = {x.id: parse_agent(buyers, "buyer").build(market, [seed, 1, k]) for k, x in enumerate(market.buyers)}
    return anyio.run(lambda: run_episode(market, s, b, episode_id=f"{seller}-{seed}", labels={"seller": seller, "seed": market.seed})).events


def strip_ts(events):
    return [{k: v for k, v in e.items() if k not in ("ts", "time", "wall_s", "episode")} for e in events]


# -- rewards -----------------------------------------------------------------------------------------


def test_rewards_by_hand_on_a_played_episode():
    events = play()
    deals = [e for e in events if e["type"] == "deal"]
    # small_market: p1 cost 200, p2 cost 300; b1 values (500, 650), b2 (450, 700). OPT: b1-p1 300 + b2-p2 400 = 700.
    profit = sum(d["price"] - d["cost"] for d in deals)
    violations = sum(1 for e in events if e["type"] == "violation" and e["who"] == SELLER)
    assert profit_share(events) == pytest.approx(profit / 700)
    assert profit_penalized(events) == pytest.approx(profit / 700 - 0.1 * violations)
    assert 0 < profit_share(events) <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), seller=st.sampled_from(["random", "greedy", "concession", "dutch"]),
       buyers=st.sampled_from(["random", "threshold", "stubborn"]), split=st.sampled_from(["train", "shapes", "correlated"]))
def test_rewards_stay_in_their_ranges(seed, seller, buyers, split):
    events = play(seller, buyers, market=generate(SPLITS[split], seed), seed=seed)
    assert 0.0 <= profit_share(events) <= 1.0
    assert -1.0 <= profit_penalized(events) <= 1.0
    assert profit_penalized(events) <= profit_share(events)
    assert 0.0 <= REWARDS["welfare"](events) <= 1.0 and 0.0 <= REWARDS["adherence"](events) <= 1.0


def test_a_failed_episode_has_no_reward_and_unknown_names_are_refused():
    events = play()
    events[-1] = events[-1] | {"outcome": "failed", "metrics": None}
    assert all(fn(events) is None for fn in REWARDS.values())
    with pytest.raises(ValueError, match="unknown reward 'nope'; choose from profit-penalized"):
        reward_fn("nope")


def test_rewards_read_the_events_not_the_logged_metrics():
    events = play()
    events[-1] = events[-1] | {"metrics": {"profit_ratio": 123.0}}  # a forged end line changes nothing
    assert profit_share(events) <= 1


# -- the dataset -----------------------------------------------------------------------------------


def test_replay_reaches_the_recorded_events():
    for seller, buyers in (("greedy", "threshold"), ("random", "random"), ("concession", "stubborn")):
        events = play(seller, buyers, seed=3)
        seen, state = replay(events)
        assert strip_ts(state.events) == strip_ts([e for e in events if e["type"] not in ("episode_start", "episode_end")])
        assert len(seen) == sum(1 for e in events if e["type"] == "message" and e["sender"] == SELLER)


def test_scripted_decisions_are_the_prompt_an_llm_would_see_and_tagged_text():
    events = play()
    ds = decisions(events, reward=0.5, group="g")
    sent = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    assert len(ds) == len(sent) >= 2
    first = ds[0]
    from negotiate.regulator import EpisodeState, observe

    assert first.prompt == render_seller(observe(EpisodeState(small_market()), SELLER), "tagged")
    m = sent[0]
    assert first.completion == f"To: {m['to']}\nTalk: {m['talk']}\nAction: [OFFER] {m['action']['product']} ${m['action']['price']}"
    assert first.turn == 1 and first.valid and first.reward == 0.5 and first.prompt_ids is None
    # The second prompt shows the first offer and the buyer's answer in its thread.
    assert f"you: [OFFER] {m['action']['product']} ${m['action']['price']}" in ds[1].prompt[1]["content"]


def test_scripted_decisions_under_the_compact_prompt():
    events = play()
    ds = decisions(events, reward=0.5, group="g", prompt="compact")
    full = decisions(events, reward=0.5, group="g")
    from negotiate.regulator import EpisodeState, observe

    assert ds[0].prompt == render_seller_compact(observe(EpisodeState(small_market()), SELLER))
    assert [d.completion for d in ds] == [d.completion for d in full]  # the same replies, under another prompt
    m = next(e for e in events if e["type"] == "message" and e["sender"] == SELLER)
    assert f"{m['to']}: owes you a reply\n  you: [OFFER] {m['action']['product']} ${m['action']['price']}\n" in ds[1].prompt[1]["content"]
    assert sum(len(c["content"]) for d in ds for c in d.prompt) < 0.5 * sum(len(c["content"]) for d in full for c in d.prompt)


@pytest.mark.parametrize("teacher", ["greedy", "planner", "posted", "concession", "dutch"])
@pytest.mark.parametrize("buyers", ["threshold", "concession"])
def test_a_teacher_labelling_its_own_episodes_gives_back_its_own_messages(teacher, buyers):
    # Following its own messages, the teacher is in the state it was in when it played: every label is what it sent.
    for seed in (1, 2, 3):
        events = play(teacher, buyers, market=generate(SPLITS["train"], seed), seed=seed)
        labelled = teacher_decisions(events, teacher, reward=0.5, group="g", prompt="compact")
        own = decisions(events, reward=0.5, group="g", prompt="compact")
        assert [(d.turn, d.prompt, d.completion) for d in labelled] == [(d.turn, d.prompt, d.completion) for d in own]
        assert len(own) >= 2


def test_the_teacher_labels_another_sellers_states_with_what_it_learned_from_them():
    # One buyer (value 500), one product (cost 200), 3 turns, values in 100-1000. The dutch clock offers $1000, $600
    # and $200 (sold). Greedy with k turns left offers cost + (high - cost) k / (k + 1): $800 at the start; $733 once
    # $1000 was refused (high 999, k=2: 200 + 799 x 2/3); $400 once $600 was too (high 599, k=1). A teacher that had
    # not followed dutch's offers would still say $600 at the last turn.
    market = Market(spec=SPLITS["train"], seed=0, products=(Product("p1", "Air tent", 200, 1),),
                    buyers=(Buyer("b1", (500,), "neutral"),), budget=3, price_low=100, price_high=1000)
    events = play("dutch", market=market)
    sent = [e["action"]["price"] for e in events if e["type"] == "message" and e["sender"] == SELLER]
    assert sent == [1000, 600, 200]
    labelled = teacher_decisions(events, "greedy", reward=0.3, group="g")
    assert [d.completion.rsplit("\n", 1)[1] for d in labelled] == ["Action: [OFFER] p1 $800", "Action: [OFFER] p1 $733",
                                                                   "Action: [OFFER] p1 $400"]
    assert [d.turn for d in labelled] == [1, 2, 3] and all(d.valid and d.reward == 0.3 for d in labelled)
    # Each prompt is the state dutch was in: its own refused $1000 is in the thread the label answers.
    assert [d.prompt for d in labelled] == [d.prompt for d in decisions(events, reward=0.3, group="g")]
    assert "you: [OFFER] p1 $1000" in labelled[1].prompt[1]["content"]


def test_a_teacher_waits_where_it_would_not_speak_and_a_logged_prompt_is_kept():
    # The planner sends one offer at a time to buyers who only accept or reject: while one is unanswered it waits,
    # so a state where greedy writes to the second buyer gets no label from it.
    events = play("greedy", seed=0)
    sent = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    greedy_turns = [e["turn"] for e in sent]
    planner = teacher_decisions(events, "planner", reward=0.0, group="g")
    assert 0 < len(planner) < len(greedy_turns) and {d.turn for d in planner} < set(greedy_turns)
    logged = [dict(e, extra={"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": f"U{e['turn']}"},
                                        {"role": "user", "content": "a re-ask"}]}) if e["type"] == "message" and e["sender"] == SELLER
              else e for e in events]
    assert [d.prompt for d in teacher_decisions(logged, "greedy", reward=0.0, group="g")] == [
        [{"role": "system", "content": "S"}, {"role": "user", "content": f"U{t}"}] for t in greedy_turns]


def test_agreement_counts_each_seller_message_against_the_teachers_reply_worked_out_by_hand(tmp_path):
    # The dutch episode above: dutch offers $1000, $600, $200 to b1; greedy would have offered $800, $733, $400 to b1, p1.
    market = Market(spec=SPLITS["train"], seed=0, products=(Product("p1", "Air tent", 200, 1),),
                    buyers=(Buyer("b1", (500,), "neutral"),), budget=3, price_low=100, price_high=1000)
    events = play("dutch", market=market)
    trace = tmp_path / "t" / "dutch.jsonl"
    trace.parent.mkdir()
    trace.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (a,) = teacher_agreement([tmp_path / "t"], "greedy").values()
    assert dict(a.kinds) == {("offer", "offer"): 3} and (a.states, a.same_kind) == (3, 3)
    assert (a.both_offered, a.same_offer, a.price_gap) == (3, 3, 200 + 133 + 200)
    (own,) = teacher_agreement([tmp_path / "t"], "dutch").values()  # a teacher against its own episode: no gap
    assert (own.same_kind, own.same_offer, own.price_gap) == (3, 3, 0)
    last = max(k for k, e in enumerate(events) if e["type"] == "message" and e["sender"] == SELLER)
    for name, value in dict(action=None, to=None, valid=False, raw="Action: [HAGGLE]", error="no action", error_kind="malformed").items():
        setattr(events[last], name, value)
    del events[last + 1]  # b1's accept: an invalid message reaches no one
    trace.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (a,) = teacher_agreement([tmp_path / "t"], "greedy").values()  # the last reply did not parse: an invalid message
    assert dict(a.kinds) == {("offer", "offer"): 2, ("offer", "invalid"): 1} and a.price_gap == 200 + 133
    assert events[last - 2]["sender"] == SELLER and events[last - 1]["sender"] == "b1"
    del events[last - 2]  # the seller's second offer gone, b1's answer to it kept: the regulator cannot replay that
    trace.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    with pytest.raises(UserError, match=r"dutch.jsonl: episode .* cannot be replayed"):
        teacher_agreement([tmp_path / "t"], "greedy")


def test_thoughts_are_checked_against_the_planners_reasons_worked_out_by_hand(tmp_path, capsys):
    # One buyer (value 800, conceding from 0.5 over 3 rounds), one unit (cost 100), 10 turns: the planner offers,
    # b1 bids $400, the planner holds out ($600), b1 accepts. Its reasons: "b1 has not bid; 10 turns for 1 buyer:
    # offer p1", then "b1 bids $400 (first bid, covers cost); 9 turns for 1 buyer: hold out".
    market = Market(spec=SPLITS["train"], seed=0, products=(Product("p1", "A", 100, 1),), buyers=(Buyer("b1", (800,)),),
                    budget=10, price_low=100, price_high=1000)
    events = play("planner?reasons=1", "concession?start=0.5&patience=3", market=market)
    sent = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    assert [e["thought"] for e in sent] == ["b1 has not bid; 10 turns for 1 buyer: offer p1",
                                            "b1 bids $400 (first bid, covers cost); 9 turns for 1 buyer: hold out"]
    # A policy that read the facts right but says "take it" at its second message, and still offers.
    sent[1]["thought"] = "b1 bids $400 (first bid, covers cost); 9 turns for 1 buyer: take it"
    trace = tmp_path / "t" / "policy.jsonl"
    trace.parent.mkdir()
    trace.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (a,) = teacher_agreement([tmp_path / "t"], "planner?reasons=1").values()
    assert dict(a.reasons) == {"states": 2, "is_reason": 2, "facts": 2, "turns": 2, "verdict": 1, "buyer": 2, "buyer_reason": 2,
                               "buyer_facts": 2, "follows": 1}
    (plain,) = teacher_agreement([tmp_path / "t"], "planner").values()  # a teacher without reasons: nothing to check
    assert not plain.reasons
    sent[0]["thought"] = "p1 is nice"  # no reason at all
    trace.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    (a,) = teacher_agreement([tmp_path / "t"], "planner?reasons=1").values()
    assert dict(a.reasons) == {"states": 2, "is_reason": 1, "facts": 1, "turns": 1, "verdict": 0, "buyer": 2, "buyer_reason": 1,
                               "buyer_facts": 1, "follows": 0}
    assert main(["report", str(tmp_path / "t"), "--teacher", "planner?reasons=1", "--format", "markdown"]) == 0
    table = capsys.readouterr().out.split("reasons:")[-1]
    assert "| planner?reasons=1 | 2 | 50% | 50% | 50% | 0% | 100% | 100% | 0% |" in table  # the trace's seller label, as played
    # A seller that wrote to another buyer than the teacher's: its facts count as wrong, but not as a misreading.
    tally = Counter()
    theirs, other = read_reason("b1 bids $400 (first bid); 9 turns for 2 buyers: hold out"), "b2 has not bid; 9 turns for 2 buyers: offer p1"
    _tally_reasons(tally, theirs, read_reason(other), "offer", same_buyer=False)
    _tally_reasons(tally, theirs, theirs, "offer", same_buyer=True)
    assert dict(tally) == {"states": 2, "buyer": 1, "is_reason": 2, "facts": 1, "turns": 2, "verdict": 1, "buyer_reason": 1,
                           "buyer_facts": 1, "follows": 2}


@pytest.mark.parametrize("teacher, message", [
    ("oracle", "--teacher: 'oracle': this seller cannot follow another seller's episode; choose from planner, greedy, concession, posted, dutch"),
    ("random", "choose from planner"),
    ("hf:smollm2", "--teacher: 'hf:smollm2': a teacher is a scripted seller"),
    ("nope", "--teacher"),
])
def test_a_teacher_that_cannot_label_is_refused_in_one_line(teacher, message):
    with pytest.raises(UserError, match=re.escape(message)):
        teacher_decisions(play(), teacher, reward=0.0, group="g")


def test_logged_llm_decisions_keep_the_prompt_tokens_and_logprobs_as_logged():
    events = play()
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    for e in events:
        if e["type"] == "message" and e["sender"] == SELLER:
            e["raw"] = "Thought: x\n" + render_tagged_from(e)
            e["extra"] = {"prompt": prompt, "prompt_token_ids": [1, 2, 3], "token_ids": [7, 8], "logprobs": [-0.5, -0.25]}
    ds = decisions(events, reward=1.0, group="g")
    assert [d.completion for d in ds] == [e["raw"] for e in events if e["type"] == "message" and e["sender"] == SELLER]
    assert all(d.prompt == prompt and d.prompt_ids == [1, 2, 3] and d.completion_ids == [7, 8] and d.logprobs == [-0.5, -0.25] for d in ds)


def test_a_reasked_reply_is_learned_against_the_original_prompt_without_its_logprobs():
    events = play()
    seller = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    original = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    for e in seller:
        e["raw"] = render_tagged_from(e)
        e["extra"] = {"prompt": original, "prompt_token_ids": [1], "token_ids": [2], "logprobs": [-1.0]}
    seller[0]["extra"] = {"prompt": original + [{"role": "assistant", "content": "junk"}, {"role": "user", "content": "again"}],
                          "prompt_token_ids": [1, 9, 9], "token_ids": [2], "logprobs": [-1.0], "reasks": 1}
    first, second = decisions(events, reward=0.0, group="g")[:2]
    assert first.prompt == original and first.prompt_ids is None and first.logprobs is None and first.completion_ids is None
    assert second.prompt_ids == [1] and second.logprobs == [-1.0]


def render_tagged_from(event):
    from negotiate.protocol import Action, Message

    a = event["action"]
    return render_tagged(Message(SELLER, event["to"], event["talk"], Action(a["kind"], a.get("product"), a.get("price"))))


def test_advantages_worked_out_by_hand():
    eps = [Episode(name, group, "s", "train", r, {}) for name, group, r in
           [("a", "g1", 0.2), ("b", "g1", 0.6), ("c", "g1", 1.0), ("d", "g2", 0.5), ("e", "g2", 0.5), ("f", "g3", 0.9)]]
    # g1: mean 0.6, population sd sqrt((0.16 + 0 + 0.16) / 3) = 0.326599
    adv = advantages(eps)
    assert adv["a"] == pytest.approx(-0.4 / 0.326599, abs=1e-5) and adv["b"] == 0 and adv["c"] == pytest.approx(1.224745, abs=1e-5)
    assert adv["d"] == adv["e"] == adv["f"] == 0  # equal rewards, and a group of one: no signal
    assert advantages(eps, scale=False)["c"] == pytest.approx(0.4)


def test_rft_keeps_the_valid_decisions_of_each_groups_best_episode():
    from negotiate.training.dataset import Decision
    from negotiate.training.trainer import TrainConfig, group_best, select

    def ep(name, group, reward, valid=(True,)):
        decisions = [Decision(episode=name, group=group, turn=k, prompt=[], completion=f"{name}{k}", reward=reward, valid=v)
                     for k, v in enumerate(valid)]
        return Episode(name, group, "s", "train", reward, {}, decisions)

    eps = [ep("a", "g1", 0.2), ep("b", "g1", 0.7, valid=(True, False, True)), ep("c", "g1", 0.5),
           ep("d", "g2", 0.4), ep("e", "g2", 0.4),  # alike: nothing to prefer
           ep("f", "g3", -0.1), ep("g", "g3", 0.0),  # the best sold nothing: not imitated
           ep("h", "g4", 0.6), ep("i", "g4", 0.6), ep("j", "g4", 0.3)]  # a tie at the top: both kept
    assert [e.id for e in group_best(eps)] == ["b", "h", "i"]
    picked = select(TrainConfig(method="rft", traces=("x",)), eps)
    assert [(d.completion, w) for d, w in picked] == [("b0", 1.0), ("b2", 1.0), ("h0", 1.0), ("i0", 1.0)]  # b's invalid b1 is left out


@pytest.mark.parametrize("seed", range(6))
def test_each_decision_knows_its_action_kind_as_its_completion_writes_it(seed):
    # The planner against conceding buyers offers and accepts a bid now and then (seeds 0, 1, 3-5); dutch's states labelled by greedy.
    events = play("planner", "concession", market=generate(SPLITS["train"], seed), seed=seed)
    for made in (decisions(events, reward=0.0, group="g"), teacher_decisions(play("dutch", market=generate(SPLITS["train"], seed),
                                                                                   seed=seed), "greedy", reward=0.0, group="g")):
        assert made and [d.action for d in made] == [re.search(r"Action: \[(\w+)\]", d.completion)[1].lower() for d in made]
    sent = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    for e in sent:  # as a model's trace logs them (no replay needed)
        e["raw"], e["extra"] = render_tagged_from(e), {"prompt": [{"role": "user", "content": "U"}]}
    sent[0]["action"], sent[0]["valid"], sent[0]["raw"] = None, False, "Action: [HAGGLE]"  # a reply that did not parse has no action
    assert [d.action for d in decisions(events, reward=0.0, group="g")] == [None, *(e["action"]["kind"] for e in sent[1:])]


def test_action_weights_weigh_each_imitated_decision_by_its_action_kind():
    from negotiate.training.dataset import Decision
    from negotiate.training.trainer import TrainConfig, select

    def ep(name, group, reward, actions):
        made = [Decision(episode=name, group=group, turn=k, prompt=[], completion=f"{name}{k}", reward=reward, valid=a is not None,
                         action=a) for k, a in enumerate(actions)]
        return Episode(name, group, "s", "train", reward, {}, made)

    eps = [ep("a", "g1", 0.6, ["offer", "accept", None]), ep("b", "g1", 0.2, ["offer", "end"])]
    weights = "accept=4, end=0.5"
    assert [(d.completion, w) for d, w in select(TrainConfig(method="sft", traces=("x",), action_weights=weights), eps)] == [
        ("a0", 1.0), ("a1", 4.0), ("b0", 1.0), ("b1", 0.5)]  # the invalid a2 is left out, as before
    assert [(d.completion, w) for d, w in select(TrainConfig(method="rft", traces=("x",), action_weights=weights), eps)] == [
        ("a0", 1.0), ("a1", 4.0)]  # only g1's best episode
    assert [w for _, w in select(TrainConfig(method="dagger", traces=("x",), action_weights=weights), eps)] == [1.0, 4.0, 1.0, 1.0, 0.5]
    assert [w for _, w in select(TrainConfig(method="sft", traces=("x",)), eps)] == [1.0] * 4  # no weights: each weighs 1


def test_collect_plays_each_market_group_times_and_the_loader_groups_them(tmp_path):
    out = tmp_path / "c"
    assert main(["collect", "--seller", "random,greedy", "--markets", "3", "--group", "4", "--seed", "7", "--out", str(out), "--quiet"]) == 0
    starts = [events[0] for events in read_episodes(out / "random.jsonl")]
    assert [s["index"] for s in starts] == list(range(12)) and [s["repeat"] for s in starts] == [0, 1, 2, 3] * 3
    for g in range(3):
        members = starts[4 * g: 4 * g + 4]
        assert len({s["seed"] for s in members}) == 1 and len({group_key(s) for s in members}) == 1
        assert len({orjson.dumps(s["market"]) for s in members}) == 1
    random_runs = [[e.get("action") for e in events if e.get("sender") == SELLER] for events in read_episodes(out / "random.jsonl")]
    assert len({orjson.dumps(r) for r in random_runs[:4]}) > 1  # the seller samples afresh in each repeat
    greedy_runs = [[e.get("action") for e in events if e.get("sender") == SELLER] for events in read_episodes(out / "greedy.jsonl")]
    assert len({orjson.dumps(r) for r in greedy_runs[:4]}) == 1  # deterministic seller, identical buyers: identical episodes
    episodes = load_episodes([out], where=DataFilter(seller="random", min_group=4))
    assert len(episodes) == 12 and len({ep.group for ep in episodes}) == 3
    assert load_episodes([out], where=DataFilter(seller="random", min_group=5)) == []
    assert {ep.seller for ep in load_episodes([out], where=DataFilter(seller="greedy"))} == {"greedy"}


def test_serve_without_group_is_unchanged(tmp_path):
    # group 1 keeps the markets and seller seeds of earlier runs: episode i plays market_seed(seed, i).
    from negotiate.runner import market_seed

    assert main(["serve", "--seller", "random", "--episodes", "3", "--seed", "2", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    starts = [events[0] for events in read_episodes(tmp_path / "s" / "random.jsonl")]
    assert [s["seed"] for s in starts] == [market_seed(2, i) for i in range(3)] and all("repeat" not in s for s in starts)


# -- the trainer (torch) ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if not HAVE_TRAIN:
        pytest.skip("needs the train extra: pip install 'negotiate[train]'")
    import torch

    torch.set_num_threads(1)
    completions = [render_tagged_from(e) for seed in range(4) for e in play(seed=seed) if e["type"] == "message" and e["sender"] == SELLER]
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-train"), tuple(completions), vocab=600)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    spec = out / "small.toml"
    spec.write_text('split = "train"\nname = "small"\nbuyers = 2\nproducts = 2\n')
    assert main(["collect", "--seller", "greedy,random", "--split", str(spec), "--markets", "4", "--group", "3",
                 "--out", str(out / "run"), "--quiet"]) == 0
    return out


def config(tiny, out, **kw):
    from negotiate.training.trainer import TrainConfig

    base = dict(model=str(tiny), out=str(out), threads=1, max_tokens=12, gen_batch=8, batch_size=4)
    return TrainConfig(**(base | kw))


@needs_train
def test_sft_lowers_the_loss_of_the_greedy_sellers_messages(tiny, traces, tmp_path):
    import torch

    from negotiate.training.trainer import build_examples, completion_logprobs, load_episodes as _le, load_policy, train

    cfg = config(tiny, tmp_path / "sft", traces=(str(traces / "run"),), seller="greedy", lr=3e-3, max_steps=12, lora=False)
    model, tokenizer = load_policy(cfg)
    examples, counts = build_examples(cfg, _le(cfg.traces, where=DataFilter(seller="greedy")), model, tokenizer)
    assert counts["examples"] == len(examples) > 0 and all(ex.weight == 1.0 for ex in examples)
    # The completion ends with the chat template's end-of-turn token, as generation would.
    assert all(ex.completion_ids[-1] == tokenizer.eos_token_id for ex in examples)

    def nll() -> float:
        with torch.no_grad():
            return sum(-float(completion_logprobs(model, ex).sum()) for ex in examples[:6])

    before = nll()
    summary = train(cfg)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")  # the merged checkpoint
    after = nll()
    assert after < before * 0.8, (before, after)
    rows = [orjson.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_bytes().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13)) and all(r["tokens"] > 0 for r in rows)
    assert (tmp_path / "sft" / "curve.png").stat().st_size > 1000 and not (tmp_path / "sft" / "adapter").exists()  # a full fine-tune
    assert summary["load_as"] == f"hf:{tmp_path / 'sft'}"


@needs_train
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_batch_sharing_its_prompt_prefix_gives_the_log_probs_and_gradients_of_separate_passes(tiny, tmp_path, checkpointing):
    import torch

    from negotiate.training.trainer import Example, batch_logprobs, checkpoint_layers, load_policy

    cfg = config(tiny, tmp_path / "b", lora=True)
    model, tokenizer = load_policy(cfg)
    checkpoint_layers(model, checkpointing)  # the layers recomputed in the backward pass still see the shared prefix once
    model.train()  # checkpointing acts in training mode only

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    system = ids("You are the seller. " * 12)  # a shared prefix longer than MIN_SHARED
    examples = [Example(system + ids(state), ids(reply), 1.0, None, 0.0, True) for state, reply in [
        ("Turn budget: 6 of 6 messages left.", "To: b1\nAction: [OFFER] p1 $600"),
        ("Turn budget: 2 of 6 messages left. Buyers: b2 bid $450 for p2.", "To: b2\nAction: [ACCEPT] p2 $450"),
        ("Turn", "Action: [END]"),
    ]]
    assert len(system) >= 32

    def separate(ex: Example):  # the plain way: the whole sequence, every position's logits
        full = torch.tensor([ex.prompt_ids + ex.completion_ids], device=model.device)  # load_policy puts it on a GPU where there is one
        logits = model(input_ids=full).logits[0, len(ex.prompt_ids) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, full[0, len(ex.prompt_ids):, None])[:, 0]

    def grads(loss) -> list:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.requires_grad]

    plain = [separate(ex) for ex in examples]
    batched = batch_logprobs(model, examples)
    for a, b, ex in zip(plain, batched, examples):
        assert a.shape == b.shape == (len(ex.completion_ids),)
        assert torch.allclose(a, b, atol=1e-5), (a, b)
    weights = [1.0, -0.5, 2.0]
    expected = grads(sum(w * lp.sum() for w, lp in zip(weights, [separate(ex) for ex in examples])))
    got = grads(sum(w * lp.sum() for w, lp in zip(weights, batch_logprobs(model, examples))))
    assert all(torch.allclose(e, g, atol=1e-6, rtol=1e-4) for e, g in zip(expected, got))
    assert any(float(e.abs().max()) > 0 for e in expected)


@needs_train
@pytest.mark.parametrize("lora", [True, False])
def test_gradient_checkpointing_keeps_the_loss_and_gradients_of_a_step(tiny, traces, tmp_path, lora):
    import torch

    from negotiate.training.trainer import batch_loss_backward, build_examples, checkpoint_layers, load_episodes as _le, load_policy

    cfg = config(tiny, tmp_path / "c", lora=lora, micro_batch=3, traces=(str(traces / "run"),))
    model, tokenizer = load_policy(cfg)
    model.train()
    examples, _ = build_examples(cfg, _le(cfg.traces), model, tokenizer)
    batch = examples[:5]
    tokens = sum(len(ex.completion_ids) for ex in batch)

    def step(on: bool):
        checkpoint_layers(model, on)
        model.zero_grad(set_to_none=True)
        loss = batch_loss_backward(cfg, model, batch, {}, tokens)
        return loss, [p.grad.clone() for p in model.parameters() if p.requires_grad]

    plain, plain_grads = step(False)
    kept, kept_grads = step(True)
    assert kept == pytest.approx(plain, rel=1e-6) and plain > 0
    assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(plain_grads, kept_grads))


@needs_train
def test_one_offline_grpo_step_moves_logprobs_in_the_sign_of_the_advantage(tiny, tmp_path):
    import torch

    from negotiate.training.trainer import Example, completion_logprobs, example_loss, load_policy

    cfg = config(tiny, tmp_path / "pg", method="offline-grpo", traces=("x",), lr=1e-2)
    model, tokenizer = load_policy(cfg)
    prompt = list(tokenizer("Turn budget: 6 of 6 messages left.", add_special_tokens=False)["input_ids"])
    good = Example(prompt, list(tokenizer("To: b1\nAction: [OFFER] p1 $600", add_special_tokens=False)["input_ids"]), +1.0, None, 1.0, True)
    bad = Example(prompt, list(tokenizer("To: b2\nAction: [END]", add_special_tokens=False)["input_ids"]), -1.0, None, 0.0, True)
    with torch.no_grad():
        before = [float(completion_logprobs(model, ex).sum()) for ex in (good, bad)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    stats = {"ratio": [], "clipped": [], "kl": []}
    tokens = len(good.completion_ids) + len(bad.completion_ids)
    for ex in (good, bad):
        (example_loss(cfg, model, ex, stats) / tokens).backward()
    optimizer.step()
    assert stats["ratio"] == pytest.approx([1.0, 1.0])  # the first update: ratio 1 against the policy's own log-probs
    with torch.no_grad():
        after = [float(completion_logprobs(model, ex).sum()) for ex in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]


@needs_train
def test_an_imitated_decisions_loss_is_its_weight_times_its_negative_log_likelihood():
    import torch

    from negotiate.training.trainer import Example, TrainConfig, example_loss

    logp = torch.tensor([-1.0, -2.0])  # two completion tokens: NLL 3
    for method in ("sft", "rft", "dagger"):
        cfg = TrainConfig(method=method, traces=("x",))
        losses = [float(example_loss(cfg, None, Example([1], [2, 3], w, None, 0.0, True), {}, logp=logp)) for w in (1.0, 4.0, 0.5)]
        assert losses == [3.0, 12.0, 1.5], method


@needs_train
def test_the_clip_stops_the_push_once_the_ratio_leaves_the_band(tiny, tmp_path):
    import torch

    from negotiate.training.trainer import Example, example_loss, load_policy

    cfg = config(tiny, tmp_path / "clip", method="offline-grpo", traces=("x",), clip_eps=0.2)
    model, tokenizer = load_policy(cfg)
    ids = list(tokenizer("To: b1", add_special_tokens=False)["input_ids"])
    from negotiate.training.trainer import completion_logprobs

    with torch.no_grad():
        now = completion_logprobs(model, Example(ids, ids, 1.0, None, 0, True)).tolist()
    # Logged log-probs far below the current ones: ratio e^2 > 1.2, positive advantage, clipped: no gradient.
    ex = Example(ids, ids, 1.0, [lp - 2.0 for lp in now], 0, True)
    stats = {"ratio": [], "clipped": [], "kl": []}
    example_loss(cfg, model, ex, stats).backward()
    assert stats["clipped"] == [1.0] and stats["ratio"][0] == pytest.approx(math.exp(2), rel=1e-4)
    assert all(p.grad is None or float(p.grad.abs().max()) == 0 for p in model.parameters() if p.requires_grad)


@needs_train
@pytest.mark.parametrize("fresh", [False, True])
def test_the_policys_evaluation_episodes_keep_fresh(tiny, traces, tmp_path, fresh):
    # train --fresh reaches the run the policy plays in (evaluation and online-grpo's rollouts): each episode_start
    # records it, as serve --fresh does, and only where it is set; the markets are the ones serve --seed 5 plays.
    from negotiate.training.trainer import evaluate_policy, load_policy

    cfg = config(tiny, tmp_path / "x", fresh=fresh)
    model, tokenizer = load_policy(cfg, wrap=False)
    played = evaluate_policy(model, tokenizer, cfg, tmp_path / "eval.jsonl", episodes=2, run_seed=5, split=str(traces / "small.toml"))
    starts = [events[0] for events in read_episodes(tmp_path / "eval.jsonl")]
    assert [s.get("fresh") for s in starts] == ([True, True] if fresh else [None, None]) and len(played) == 2
    assert main(["serve", "--seller", "greedy", "--split", str(traces / "small.toml"), "--episodes", "2", "--seed", "5",
                 "--out", str(tmp_path / "serve"), "--quiet"]) == 0
    assert [e[0]["market"] for e in read_episodes(next((tmp_path / "serve").glob("greedy*.jsonl")))] == [s["market"] for s in starts]


@needs_train
def test_offline_grpo_from_collected_groups_and_the_checkpoint_plays_as_a_seller(tiny, traces, tmp_path):
    from negotiate.training.trainer import train

    cfg = config(tiny, tmp_path / "grpo", method="offline-grpo", traces=(str(traces / "run"),), seller="random", min_group=3,
                 max_steps=3, kl_beta=0.05, eval_episodes=2, eval_splits=str(traces / "small.toml"))
    summary = train(cfg)
    assert summary["data"]["examples"] > 0 and [e["step"] for e in summary["evals"]] == [0, 3]
    rows = [orjson.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_bytes().splitlines()]
    assert all("ratio" in r and "kl" in r for r in rows if "loss" in r)
    assert len(list(read_episodes(tmp_path / "grpo" / "eval" / "step-00003.jsonl"))) == 2
    assert (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()  # LoRA: the adapter alone, beside the merged weights
    # The checkpoint is an hf: seller.
    out = tmp_path / "play"
    assert main(["serve", "--seller", f"hf:{tmp_path / 'grpo'}?max_tokens=8&temperature=1", "--split", str(traces / "small.toml"),
                 "--episodes", "1", "--out", str(out), "--quiet"]) == 0
    (events,) = read_episodes(next(out.glob("hf-*.jsonl")))
    assert events[-1]["outcome"] in ("terminated", "truncated")
    assert events[1]["extra"]["token_ids"] and events[1]["extra"]["model"].endswith("grpo")


@needs_train
def test_rft_trains_on_the_best_random_episode_of_each_group_and_raises_its_likelihood(tiny, traces, tmp_path):
    import torch

    from negotiate.training.trainer import build_examples, completion_logprobs, group_best, load_policy, train

    # The random seller breaks rules often enough that its penalized rewards are mostly below 0: rank by profit share.
    cfg = config(tiny, tmp_path / "rft", method="rft", traces=(str(traces / "run"),), seller="random", min_group=3, lr=3e-3,
                 epochs=3, reward="profit")
    episodes = load_episodes(cfg.traces, reward="profit", where=DataFilter(seller="random", min_group=3))
    best = group_best(episodes)
    assert 0 < len(best) <= 4 < len(episodes) == 12
    model, tokenizer = load_policy(cfg)
    examples, counts = build_examples(cfg, episodes, model, tokenizer)
    assert counts["examples"] == len(examples) == sum(d.valid for e in best for d in e.decisions)
    assert {ex.reward for ex in examples} == {e.reward for e in best if any(d.valid for d in e.decisions)}

    def nll(m) -> float:
        with torch.no_grad():
            return sum(-float(completion_logprobs(m, ex).sum()) for ex in examples)

    before = nll(model)
    summary = train(cfg)
    from transformers import AutoModelForCausalLM

    after = nll(AutoModelForCausalLM.from_pretrained(tmp_path / "rft"))
    assert after < before, (before, after)
    assert summary["steps"] == math.ceil(len(examples) * 3 / 4) and summary["data"]["examples"] == len(examples)
    assert (tmp_path / "rft" / "adapter" / "adapter_config.json").is_file()


@needs_train
def test_dagger_learns_the_teachers_labels_on_the_random_sellers_states(tiny, traces, tmp_path):
    import torch

    from negotiate.training.trainer import build_examples, completion_logprobs, encode_completion, load_policy, train

    cfg = config(tiny, tmp_path / "dagger", method="dagger", teacher="greedy", traces=(str(traces / "run"),), seller="random",
                 min_group=1, lr=3e-3)
    episodes = load_episodes(cfg.traces, where=DataFilter(seller="random"), teacher="greedy")
    labels = [d for ep in episodes for d in ep.decisions]
    sent = sum(1 for ep in episodes for e in ep.record.messages() if e.sender == SELLER)
    assert 0 < len(labels) <= sent  # every state of the random seller's, but those where greedy would wait
    own = {(d.episode, d.turn): d.completion for ep in load_episodes(cfg.traces, where=DataFilter(seller="random")) for d in ep.decisions}
    assert sum(own[d.episode, d.turn] == d.completion for d in labels) < len(labels) / 4  # greedy's replies, not random's
    model, tokenizer = load_policy(cfg)
    examples, counts = build_examples(cfg, episodes, model, tokenizer)
    assert counts["examples"] == len(examples) == len(labels)
    from negotiate.agents.hf import stop_tokens

    stops = stop_tokens(model, tokenizer)
    assert [ex.completion_ids for ex in examples] == [encode_completion(tokenizer, d.prompt, d.completion, stops) for d in labels]

    def nll(m) -> float:
        with torch.no_grad():
            return sum(-float(completion_logprobs(m, ex).sum()) for ex in examples)

    before = nll(model)
    # --max-steps past one pass over the few labelled states takes every step asked for (a dagger round asks for
    # more steps than its states fill), going round them again: the last step is in the third pass.
    steps = 2 * math.ceil(len(examples) / 4) + 1
    summary = train(dataclasses.replace(cfg, max_steps=steps))
    from transformers import AutoModelForCausalLM

    assert nll(AutoModelForCausalLM.from_pretrained(tmp_path / "dagger")) < before
    rows = [orjson.loads(line) for line in (tmp_path / "dagger" / "metrics.jsonl").read_bytes().splitlines()]
    assert summary["steps"] == steps == len(rows) and rows[-1]["epoch"] > 2


@pytest.mark.skipif(not HAVE_TRL, reason="needs trl and datasets: pip install 'negotiate[train]'")
def test_a_trl_grpo_step_through_the_rollout_function(tiny, traces, tmp_path, monkeypatch):
    from negotiate.training import online
    from negotiate.training.methods import train

    # A random tiny model breaks every rule alike; reward something its samples vary in, so the step has a signal.
    def characters(events):
        return float(sum(len(e.get("raw", "")) for e in events if e["type"] == "message" and e["sender"] == SELLER))

    monkeypatch.setitem(REWARDS, "characters", characters)
    calls = []
    real = online.make_rollout

    def spy(*args, **kwargs):
        rollout = real(*args, **kwargs)

        def wrapped(prompts, trainer):
            result = rollout(prompts, trainer)
            calls.append((list(prompts), result))
            return result

        return wrapped

    monkeypatch.setattr(online, "make_rollout", spy)
    cfg = config(tiny, tmp_path / "online", method="online-grpo", reward="characters", split=str(traces / "small.toml"),
                 markets=2, group=2, batch_size=4, max_steps=1, lr=1e-2, temperature=1.5)
    summary = train(cfg)
    (prompts, result), = calls
    assert sorted(prompts) == ["market 0", "market 0", "market 1", "market 1"]  # each market num_generations times
    assert len(result["completion_ids"]) == len(result["prompt_ids"]) == len(result["logprobs"]) == len(result["episode_reward"]) == 4
    assert all(len(c) == len(lp) > 0 for c, lp in zip(result["completion_ids"], result["logprobs"]))
    rows = [orjson.loads(line) for line in (tmp_path / "online" / "metrics.jsonl").read_bytes().splitlines()]
    assert rows[-1]["step"] == 1 and rows[-1]["reward"] is not None
    assert summary["steps"] == 1 and (tmp_path / "online" / "config.json").exists()
    from transformers import AutoModelForCausalLM

    start, trained = AutoModelForCausalLM.from_pretrained(tiny), AutoModelForCausalLM.from_pretrained(tmp_path / "online")
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(start.parameters(), trained.parameters()))
    assert moved > 0  # rewards differed within a group: the step changed the weights


@pytest.mark.skipif(not HAVE_TRL, reason="needs trl and datasets: pip install 'negotiate[train]'")
def test_ctrl_c_in_online_grpo_after_a_step_saves_it_and_says_so(tiny, traces, tmp_path, monkeypatch):
    """online-grpo keeps what its finished steps learned, as sft does: a stop after step 1 of 3 leaves a checkpoint
    that loads, weights moved from the start, and train.json saying it was interrupted after 1 step."""
    from transformers import AutoModelForCausalLM

    from negotiate.training.methods import train
    from negotiate.training.trainer import MetricsLog

    def characters(events):
        return float(sum(len(e.get("raw", "")) for e in events if e["type"] == "message" and e["sender"] == SELLER))

    monkeypatch.setitem(REWARDS, "characters", characters)
    write = MetricsLog.write

    def stop_at_one(self, row):
        write(self, row)
        if row.get("step") == 1 and "loss" in row:
            raise KeyboardInterrupt

    monkeypatch.setattr(MetricsLog, "write", stop_at_one)
    out = tmp_path / "online"
    cfg = config(tiny, out, method="online-grpo", reward="characters", split=str(traces / "small.toml"),
                 markets=2, group=2, batch_size=4, max_steps=3, lr=1e-2, temperature=1.5)
    with pytest.raises(KeyboardInterrupt) as stopped:
        train(cfg)
    assert (stopped.value.steps, stopped.value.total_steps, stopped.value.checkpoint) == (1, 3, str(out))
    summary = orjson.loads((out / "train.json").read_bytes())
    assert summary["steps"] == 1 and summary["interrupted"] is True
    start, trained = AutoModelForCausalLM.from_pretrained(tiny), AutoModelForCausalLM.from_pretrained(out)
    assert max(float((a - b).detach().abs().max()) for a, b in zip(start.parameters(), trained.parameters())) > 0


# -- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--method", "ppo", "--traces", "x"], "--method: 'ppo': unknown method; choose from sft, rft, dagger, offline-grpo, online-grpo"),
    (["--method", "sft"], "--traces: sft learns from traces: give --traces DIR"),
    (["--traces", "x", "--prompt", "short"], "--prompt: 'short': choose from full, compact"),
    (["--traces", "x", "--set", "reward=money"], "--set: reward: 'money': unknown reward"),
    (["--traces", "x", "--set", "top=0"], "--set: top: 0.0: must be in (0, 1]"),
    (["--traces", "x", "--batch-size", "0"], "--batch-size: 0: must be at least 1"),
    (["--traces", "x", "--max-steps", "0"], "--max-steps: 0: must be at least 1"),
    (["--traces", "x", "--epochs", "0"], "--epochs: 0.0: must be above 0"),
    (["--traces", "x", "--method", "offline-grpo", "--set", "kl_beta=0.1", "--set", "lora=false"], "--set: kl_beta: 0.1: a KL to the reference needs LoRA"),
    (["--traces", "x", "--method", "dagger", "--teacher", "oracle"], "--teacher: 'oracle': this seller cannot follow another seller's"),
    (["--traces", "x", "--set", "action_weights=bid=2"], "--set: action_weights: 'bid=2': 'bid' is not a seller action; choose from offer, accept"),
    (["--traces", "x", "--set", "action_weights=accept"], "--set: action_weights: 'accept': 'accept' is not kind=weight (e.g. accept=4)"),
    (["--traces", "x", "--set", "action_weights=accept=0"], "the weight of 'accept' must be a number above 0, not '0'"),
    (["--traces", "x", "--set", "action_weights=accept=many"], "the weight of 'accept' must be a number above 0, not 'many'"),
    (["--traces", "x", "--set", "action_weights=accept=2,accept=3"], "'accept' is given twice"),
    (["--traces", "x", "--method", "offline-grpo", "--set", "action_weights=accept=2"],
     "--set: action_weights: 'accept=2': weighs imitated decisions: use it with --method sft, rft, dagger"),
])
def test_train_flags_are_checked_before_anything_loads(argv, message, capsys, tmp_path):
    assert main(["train", "--out", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err


@needs_train
def test_train_refuses_missing_traces_and_a_finished_checkpoint(capsys, tmp_path):
    assert main(["train", "--traces", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "no such trace file or folder" in capsys.readouterr().err
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "train.json").write_text("{}")
    assert main(["train", "--traces", str(tmp_path), "--out", str(tmp_path / "done"), "--quiet"]) == 2
    assert "already holds a trained checkpoint" in capsys.readouterr().err


def test_every_train_flag_is_a_config_field_with_help():
    from negotiate.settings import command_flags
    from negotiate.training.trainer import TrainConfig

    for name, flag, _default in command_flags(TrainConfig, "train"):
        assert flag.help, f"TrainConfig.{name} has no help text"


@pytest.mark.parametrize("argv, message", [
    (["--lr", "-1"], "--lr: -1.0: must be above 0"),
    (["--lr", "nan"], "--lr: nan: must be a finite number"),
    (["--epochs", "nan"], "--epochs: nan: must be a finite number"),
    (["--set", "kl_beta=-1"], "--set: kl_beta: -1.0: must be 0 or more"),
    (["--set", "weight_decay=-0.1"], "--set: weight_decay: -0.1: must be 0 or more"),
    (["--set", "temperature=-1"], "--set: temperature: -1.0: must be from 0 to 2 (0: greedy)"),
    (["--eval-episodes", "-5"], "--eval-episodes: -5: must be 0 or more (0: none)"),
    (["--set", "eval_every=-1"], "--set: eval_every: -1: must be 0 or more (0: only before and after)"),
    (["--set", "clip_eps=-1"], "--set: clip_eps: -1.0: must be above 0"),
    (["--set", "max_grad_norm=0"], "--set: max_grad_norm: 0.0: must be above 0 (inf: no clipping)"),
    (["--set", "min_group=0"], "--set: min_group: 0: must be at least 1"),
    (["--threads", "0"], "--threads: 0: must be at least 1"),
])
def test_a_number_out_of_its_range_is_one_line_naming_its_flag_and_no_folder_is_made(argv, message, capsys, tmp_path):
    assert main(["train", "--traces", "x", "--out", str(tmp_path / "o"), *argv]) == 2
    assert capsys.readouterr().err == f"negotiate train: error: {message}\n"
    assert not (tmp_path / "o").exists()


def test_online_grpo_refuses_greedy_rollouts_and_an_unknown_split_while_documented_zeros_pass():
    from negotiate.training.trainer import TrainConfig

    # 0 means something for each of these (no eval, no KL, no decay, greedy evaluation); inf is no clipping.
    TrainConfig(traces=("x",), eval_episodes=0, eval_every=0, kl_beta=0.0, weight_decay=0.0, temperature=0.0, max_grad_norm=math.inf).check()
    with pytest.raises(UserError, match=re.escape("temperature: 0.0: online-grpo samples its rollouts: must be above 0")):
        TrainConfig(method="online-grpo", temperature=0.0).check()
    with pytest.raises(UserError, match=re.escape("split: 'nosuch': unknown split; choose from train")):
        TrainConfig(method="online-grpo", split="nosuch").check()


def _no_slow_work(monkeypatch):
    """Replaying traces and loading the model fail the test: a refusal must come before either."""

    def slow(*args, **kwargs):
        raise AssertionError("slow work before the refusal")

    monkeypatch.setattr("negotiate.training.trainer.load_episodes", slow)
    monkeypatch.setattr("negotiate.training.trainer.load_policy", slow)


def test_an_unknown_eval_split_is_refused_under_its_own_flag_before_the_traces_are_read(traces, tmp_path, monkeypatch, capsys):
    _no_slow_work(monkeypatch)
    spec = tmp_path / "bad.toml"
    spec.write_text('split = "nosuch"\n')
    for split, message in [
        ("nosuch", "--set: eval_splits: 'nosuch': unknown split; choose from train"),
        (str(tmp_path), f"--set: eval_splits: '{tmp_path}': is a folder; give a split or a .toml spec file"),
        (str(spec), f"{spec}: split: 'nosuch': unknown split"),
    ]:
        argv = ["train", "--traces", str(traces / "run"), "--set", f"eval_splits={split}", "--eval-episodes", "1", "--out", str(tmp_path / "o")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()


@needs_train
def test_an_out_that_is_a_file_is_one_line_and_the_file_is_kept(traces, tmp_path, monkeypatch, capsys):
    _no_slow_work(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["train", "--traces", str(traces / "run"), "--out", str(afile)]) == 2
    assert capsys.readouterr().err == f"negotiate train: error: --out: '{afile}': is a file, not a folder; choose a new folder for the checkpoint\n"
    assert main(["train", "--traces", str(traces / "run"), "--out", str(afile / "sub")]) == 2
    assert capsys.readouterr().err == (f"negotiate train: error: --out: '{afile / 'sub'}': is inside '{afile}', a file, not a folder; "
                                       "choose a new folder for the checkpoint\n")
    assert afile.read_text() == "keep"


@needs_train
def test_missing_traces_and_an_unknown_model_are_refused_before_any_trace_is_replayed(traces, tmp_path, monkeypatch, capsys):
    _no_slow_work(monkeypatch)
    out = tmp_path / "o"
    assert main(["train", "--traces", str(tmp_path / "nosuch"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"negotiate train: error: {tmp_path / 'nosuch'}: no such trace file or folder\n"
    model = tmp_path / "nosuch-model"
    assert main(["train", "--traces", str(traces / "run"), "--model", str(model), "--out", str(out)]) == 2
    assert f"--model: '{model}': no model at '{model}'" in capsys.readouterr().err
    assert not out.exists()


@needs_train
def test_a_run_refused_after_reading_the_traces_takes_back_only_what_it_made(traces, tmp_path, monkeypatch, capsys):
    _no_slow_work(monkeypatch)
    monkeypatch.setattr("negotiate.training.trainer.load_episodes", load_episodes)  # read the traces: no episode is kept
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model folder as --model is checked; never loaded
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new" / "deep" / "o", tmp_path / "keep", tmp_path / "empty"):
        argv = ["train", "--traces", str(traces / "run"), "--set", "seller=nosuch", "--model", str(model), "--out", str(out), "--quiet"]
        assert main(argv) == 2
        assert "no usable episodes" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["x"] and (tmp_path / "keep" / "x").read_text() == "x"
    assert list((tmp_path / "empty").iterdir()) == []


def test_the_help_names_every_method_that_learns_from_traces(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # argparse wraps at the terminal's width
    for argv, line in [(["--help"], "post-train a seller from traces (sft, rft, dagger, offline-grpo) or from live episodes (online-grpo)"),
                       (["train", "--help"], "trace files or folders to learn from (sft, rft, dagger, offline-grpo)")]:
        with pytest.raises(SystemExit):
            main(argv)
        assert line in " ".join(capsys.readouterr().out.split())


@needs_train
def test_the_gpu_benchmark_times_training_and_generation_on_any_device(tiny, tmp_path):
    # benchmarks/bench_gpu.py, as benchmarks/gpu_check.sh runs it on a lent GPU, here on the CPU with the tiny model.
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out, saved = tmp_path / "gpu.json", tmp_path / "random"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_gpu.py"), "--model", str(tiny), "--random-weights",
                           "--episodes", "3", "--decisions", "3", "--micro", "1,3", "--batch", "2,5", "--max-tokens", "4",
                           "--repeat", "1", "--json", str(out), "--save-random", str(saved)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and len(result["models"]) == 1
    row = result["models"][0]
    assert row["random_weights"] and row["decisions"] == 3 and row["prompt_tokens"] > row["completion_tokens"] > 0
    assert set(row["train"]) == {"1", "3"} and all(seconds > 0 for seconds in row["train"].values())
    assert set(row["generate"]) == {"2", "5"}
    for batch, timing in row["generate"].items():  # every reply has 1 to --max-tokens tokens
        assert int(batch) <= timing["tokens"] <= 4 * int(batch) and timing["seconds"] > 0
    assert "ms per decision" in done.stdout and "tokens/s" in done.stdout
    # --save-random writes a checkpoint negotiate train takes: the same architecture, other weights.
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(saved).to_dict()["hidden_size"] == AutoConfig.from_pretrained(tiny).to_dict()["hidden_size"]
    assert any(saved.glob("*.safetensors")) and (saved / "tokenizer_config.json").is_file()


def test_eval_splits_are_a_comma_separated_list_as_in_loop_and_eval_and_each_is_checked(tmp_path):
    """Issue 44: one name for one idea: train's evaluation markets are --eval-splits, as loop's (and eval's --splits)."""
    from negotiate.training.trainer import TrainConfig, eval_splits_of

    config = TrainConfig(traces=("x",), out=str(tmp_path / "o"), eval_splits="train, shapes")
    assert eval_splits_of(config) == ["train", "shapes"]
    with pytest.raises(UserError, match="^eval_splits: 'nosuch': unknown split"):  # a key of train, not a flag
        TrainConfig(traces=("x",), out=str(tmp_path / "o"), eval_splits="train,nosuch").check()


@needs_train
def test_ctrl_c_after_some_steps_saves_a_checkpoint_of_them_and_says_so(tiny, traces, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from negotiate.training.trainer import MetricsLog

    write = MetricsLog.write

    def stop_at_three(self, row):
        write(self, row)
        if row.get("step") == 3:  # Ctrl-C once the third step's update is in the weights
            raise KeyboardInterrupt

    monkeypatch.setattr(MetricsLog, "write", stop_at_three)
    out = tmp_path / "cut"
    argv = ["train", "--model", str(tiny), "--traces", str(traces / "run"), "--out", str(out), "--max-steps", "5", "--batch-size", "2",
            "--threads", "1"]
    assert main(argv) == 130
    printed = capsys.readouterr().out
    # Output to a file or a pipe (here: captured) gets a line per step while steps take under 30 s only at the ends.
    assert "train sft: step 1/5  loss " in printed and " s/step  eta 0:0" in printed
    assert f"interrupted: after step 3 of 5; its checkpoint is saved in {out}" in printed
    summary = orjson.loads((out / "train.json").read_bytes())
    assert summary["steps"] == 3 and summary["interrupted"] is True
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size > 0  # a usable checkpoint: hf:OUT loads it


@needs_train
def test_ctrl_c_before_a_step_finishes_says_that_nothing_was_saved(tiny, traces, tmp_path, monkeypatch, capsys):
    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("negotiate.training.trainer.batch_loss_backward", stop)
    out = tmp_path / "cut"
    argv = ["train", "--model", str(tiny), "--traces", str(traces / "run"), "--out", str(out), "--max-steps", "5", "--threads", "1"]
    assert main(argv) == 130
    assert f"interrupted: no checkpoint was saved in {out} (no step had finished)" in capsys.readouterr().out
    assert not (out / "train.json").exists() and not (out / "config.json").exists()
