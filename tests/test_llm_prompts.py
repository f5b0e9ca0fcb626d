"""negotiate.agents.llm: prompts (pinned against golden files, no private leaks) and parsing model text.

Regenerate the golden prompts after a deliberate prompt change with
``NEGOTIATE_UPDATE_GOLDEN=1 python -m pytest tests/test_llm_prompts.py`` and read the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from negotiate.agents.llm import PERSONAS, grounded_pattern, legal_pattern, number_range, parse_reply, render_buyer, render_seller, render_seller_compact
from negotiate.agents.views.text import _example
from negotiate.agents.planner import read_reason, reason_action
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, TALK_MAX, Action, Message, ParseFailure
from negotiate.regulator import ACTIVE, SERVED, BuyerView, EpisodeState, ProductView, SellerObservation, observe

GOLDEN = Path(__file__).parent / "golden"


def golden_market() -> Market:
    """The fixed 2x2 market of the golden prompts."""
    return Market(
        MarketSpec(name="golden"), 7,
        (Product("p1", "Basic laptop", 300, 1), Product("p2", "Pro laptop", 500, 1)),
        (Buyer("b1", (650, 900), "begging"), Buyer("b2", (420, 780), "neutral")),
        6, 100, 1000,
    )


def golden_states() -> tuple[EpisodeState, Message, EpisodeState, Message]:
    """(state at the start, -, state mid-episode, the message b2 must answer)."""
    start = EpisodeState(golden_market())
    mid = EpisodeState(golden_market())
    mid.seller_send(Message(SELLER, "b1", "The Pro is yours for $950.", Action("offer", "p2", 950), "b1 may love the Pro."))
    mid.buyer_reply("b1", Message("b1", SELLER, "Please, I only have $700 for the Pro.", Action("bid", "p2", 700), "I value it at 900."))
    offer = Message(SELLER, "b2", "The Basic for $600, today only.", Action("offer", "p1", 600), "b2 is new.")
    mid.seller_send(offer)
    mid.seller_send(Message(SELLER, "b2", "Still there?", Action("offer", "p1", 590)))  # b2 owes a reply: a violation
    mid.seller_send(ParseFailure("no 'Action:' line", "I think I will wait."))  # a malformed message: a notice
    return start, None, mid, offer


def _text(messages: list[dict]) -> str:
    return "".join(f"### {m['role']}\n{m['content']}\n" for m in messages)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NEGOTIATE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; create it with NEGOTIATE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"prompt differs from {path}; if deliberate, regenerate with NEGOTIATE_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("fmt", ["tagged", "json"])
def test_prompts_match_the_golden_files(fmt):
    start, _, mid, offer = golden_states()
    _check_golden(f"seller_start_{fmt}.txt", _text(render_seller(observe(start, SELLER), fmt)))
    _check_golden(f"seller_mid_{fmt}.txt", _text(render_seller(observe(mid, SELLER), fmt)))
    _check_golden(f"buyer_b2_{fmt}.txt", _text(render_buyer(observe(mid, "b2", offer), fmt)))
    _check_golden(f"buyer_b1_{fmt}.txt", _text(render_buyer(observe(mid, "b1", None), fmt)))


def test_golden_prompts_say_what_each_party_may_know():
    _, _, mid, offer = golden_states()
    seller = _text(render_seller(observe(mid, SELLER), "tagged"))
    assert "cost $300" in seller and "cost $500" in seller
    assert "b1: you may write to b1 now. Your standing offer: p2 $950. Its standing bid: p2 $700." in seller
    assert "b2: owes you a reply" in seller and "Write your next message to one of: b1." in seller
    assert '"Still there?" (refused: awaiting_reply: b2 has not answered' in seller  # the violation, in its thread
    assert "Notices (latest last):\n- malformed: no 'Action:' line" in seller
    assert "I value it at 900" not in seller and "$900" not in seller and "$650" not in seller
    buyer = _text(render_buyer(observe(mid, "b2", offer), "tagged"))
    assert "worth $420 to you" in buyer and "worth $780 to you" in buyer
    assert "The seller's standing offer to you: p1 $600." in buyer
    for secret in ("$300", "$500", "$650", "$900", "b2 is new", "Please, I only have"):
        assert secret not in buyer


def test_the_compact_prompt_matches_its_golden_files_and_keeps_the_threads_without_talk():
    start, _, mid, _ = golden_states()
    _check_golden("seller_start_compact.txt", _text(render_seller_compact(observe(start, SELLER))))
    _check_golden("seller_mid_compact.txt", _text(render_seller_compact(observe(mid, SELLER))))
    user = render_seller_compact(observe(mid, SELLER))[1]["content"]
    # By hand: 4 of 6 turns used (2 offers, the refused "Still there?", the malformed reply); b1 answered the
    # $950 offer of p2 with a bid of $700; b2 has not answered the $600 offer of p1; the latest notice is the malformed one.
    assert user.splitlines() == [
        "Turns left: 2 of 6. Values lie in $100-$1000.",
        "p1 cost $300, in stock",
        "p2 cost $500, in stock",
        "b1: free",
        "  you: [OFFER] p2 $950",
        "  b1: [BID] p2 $700",
        "b2: owes you a reply",
        "  you: [OFFER] p1 $600",
        "  you: [OFFER] p1 $590 (refused)",
        "Your last message was refused: malformed: no 'Action:' line",
        "Free: b1",
    ]
    # b2 rejects, is offered p1 at cost and buys it: one more turn, p1 sold out, b2's thread gone, no notice.
    mid.buyer_reply("b2", Message("b2", SELLER, "No.", Action("reject")))
    mid.seller_send(Message(SELLER, "b2", "", Action("offer", "p1", 300)))
    mid.buyer_reply("b2", Message("b2", SELLER, "Yes.", Action("accept", "p1", 300)))
    lines = render_seller_compact(observe(mid, SELLER))[1]["content"].splitlines()
    assert lines == ["Turns left: 1 of 6. Values lie in $100-$1000.", "p1 cost $300, sold out", "p2 cost $500, in stock",
                     "b1: free", "  you: [OFFER] p2 $950", "  b1: [BID] p2 $700", "b2: bought", "Free: b1"]
    assert "I value it at 900" not in user and "$900" not in user and "Please" not in user  # no thoughts, no talk


def test_the_facts_prompt_adds_the_turns_each_and_each_bidders_last_bids():
    _, _, mid, _ = golden_states()
    compact = render_seller_compact(observe(mid, SELLER))[1]["content"].splitlines()
    user = render_seller(observe(mid, SELLER), "tagged", "facts")[1]["content"].splitlines()
    # By hand: 2 turns left, both buyers active (2 // 2 = 1 each); b1's one bid is $700 for p2 (cost $500); b2 has not bid.
    # Every other line is the compact prompt's.
    assert user[:2] == ["Turns left: 2 of 6. Values lie in $100-$1000.", "2 turns for 2 buyers: 1 each."]
    assert "b1: free. b1 bids $700 (first bid, covers cost)" in user and "b2: owes you a reply. b2 has not bid" in user
    assert [line.split(". b")[0] for line in user if line != user[1]] == compact
    # A budget of 16: b1 bids $700 then $760 for p2 (rising; p2 costs $500), then, offered p1, $600 for p1 (its value is $650;
    # its standing bid now: the trend is of p1's bids, one so far; p1 costs $300), then $600 for p1 again (not rising),
    # then $450 for p2, under its cost (the last two of p2's bids: $760, $450); b2 buys p1. 6 turns used, 1 buyer active.
    m = golden_market()
    state = EpisodeState(Market(m.spec, m.seed, m.products, m.buyers, 16, m.price_low, m.price_high))
    shown = []
    for product, price in (("p2", 700), ("p2", 760), ("p1", 600), ("p1", 600), ("p2", 450)):
        state.seller_send(Message(SELLER, "b1", "", Action("offer", product, 990)))
        state.buyer_reply("b1", Message("b1", SELLER, "", Action("bid", product, price)))
        shown.append(render_seller(observe(state, SELLER), "tagged", "facts")[1]["content"].splitlines()[1:])
    assert [lines[0] for lines in shown] == [f"{left} turns for 2 buyers: {left // 2} each." for left in (15, 14, 13, 12, 11)]
    assert [line for lines in shown for line in lines if line.startswith("b1: ")] == [
        "b1: free. b1 bids $700 (first bid, covers cost)", "b1: free. b1 bids $700, $760 (rising, covers cost)",
        "b1: free. b1 bids $600 (first bid, covers cost)", "b1: free. b1 bids $600, $600 (not rising, covers cost)",
        "b1: free. b1 bids $760, $450 (not rising, below cost)"]
    state.seller_send(Message(SELLER, "b2", "", Action("offer", "p1", 300)))
    state.buyer_reply("b2", Message("b2", SELLER, "Yes.", Action("accept", "p1", 300)))
    lines = render_seller(observe(state, SELLER), "tagged", "facts")[1]["content"].splitlines()
    assert lines[1] == "10 turns for 1 buyer: 10 each." and "b2: bought" in lines


def test_the_compact_prompt_shows_the_latest_messages_of_a_long_thread():
    m = golden_market()
    state = EpisodeState(Market(m.spec, m.seed, m.products, m.buyers, 40, m.price_low, m.price_high))
    for price in range(990, 890, -10):  # ten offers of p2, each refused by b1
        state.seller_send(Message(SELLER, "b1", "talk", Action("offer", "p2", price)))
        state.buyer_reply("b1", Message("b1", SELLER, "talk", Action("reject")))
    lines = render_seller_compact(observe(state, SELLER))[1]["content"].splitlines()
    thread = lines[lines.index("b1: free") + 1:lines.index("b2: free")]
    assert thread == ["  (12 earlier messages)", "  you: [OFFER] p2 $930", "  b1: [REJECT]", "  you: [OFFER] p2 $920", "  b1: [REJECT]",
                      "  you: [OFFER] p2 $910", "  b1: [REJECT]", "  you: [OFFER] p2 $900", "  b1: [REJECT]"]


@pytest.mark.parametrize("role", [SELLER, "buyer"])
@pytest.mark.parametrize("fmt", ["tagged", "json"])
def test_the_example_in_every_prompt_parses(role, fmt):
    result, notes, _ = parse_reply(_example(role, fmt), role, SELLER if role == SELLER else "b1")
    assert isinstance(result, Message), result
    assert notes == []


# -- no prompt holds another party's private information ------------------------------------------


def _has(text: str, number: int) -> bool:
    return re.search(rf"(?<!\d){number}(?!\d)", text) is not None or f"{number:,}" in text


@st.composite
def markets_and_plays(draw):
    n = draw(st.integers(1, 3))
    m = draw(st.integers(1, 3))
    # Disjoint bands of 7-digit numbers: costs 2xxxxxx < prices 5xxxxxx < values 8xxxxxx, none of
    # which can occur by chance elsewhere in a prompt (budgets, ids, the examples' $450 and $380).
    values = draw(st.lists(st.integers(8_000_000, 8_999_999), min_size=n * m, max_size=n * m, unique=True))
    costs = draw(st.lists(st.integers(2_000_000, 2_999_999), min_size=m, max_size=m, unique=True))
    personas = draw(st.lists(st.sampled_from([*PERSONAS, "haggler"]), min_size=n, max_size=n))
    stock = draw(st.integers(1, 2))
    market = Market(
        MarketSpec(), 0,
        tuple(Product(f"p{j + 1}", f"Item {j + 1}", costs[j], stock) for j in range(m)),
        tuple(Buyer(f"b{i + 1}", tuple(values[i * m:(i + 1) * m]), personas[i]) for i in range(n)),
        draw(st.integers(1, 12)), 1_000_000, 9_999_999,
    )
    price = st.integers(5_000_000, 5_999_999)
    seller_moves = st.tuples(st.integers(0, n - 1), st.sampled_from(["offer", "accept", "reject", "end"]), st.integers(0, m - 1), price)
    buyer_moves = st.tuples(st.sampled_from(["bid", "accept", "reject", "quit"]), st.integers(0, m - 1), price)
    plays = draw(st.lists(st.tuples(seller_moves, buyer_moves), max_size=10))
    return market, plays, draw(st.sampled_from(["tagged", "json"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(markets_and_plays())
def test_no_prompt_holds_another_partys_private_values(case):
    market, plays, fmt = case
    state = EpisodeState(market)
    costs = [p.cost for p in market.products]
    values = {b.id: b.values for b in market.buyers}

    def check_seller():
        text = _text(render_seller(observe(state, SELLER), fmt)) + _text(render_seller_compact(observe(state, SELLER)))
        leaked = [v for vs in values.values() for v in vs if _has(text, v)]
        assert leaked == [], f"seller prompt holds valuations {leaked}"
        assert "BUYER-THOUGHT" not in text

    def check_buyer(buyer_id: str, message):
        text = _text(render_buyer(observe(state, buyer_id, message), fmt))
        assert all(_has(text, v) for v in values[buyer_id]), "the buyer's own values are missing"
        assert [c for c in costs if _has(text, c)] == [], "a buyer prompt holds a cost"
        others = [v for b, vs in values.items() if b != buyer_id for v in vs if _has(text, v)]
        assert others == [], f"{buyer_id}'s prompt holds other buyers' valuations {others}"
        assert "SELLER-THOUGHT" not in text and "BUYER-THOUGHT" not in text
        assert [b for b in values if b != buyer_id and f"TALK-{b}-" in text] == []

    for (i, kind, j, price), (reply, k, bid) in plays:
        if state.done or state.budget_left <= 0:
            break
        check_seller()
        to = market.buyers[i].id
        product = market.products[j].id
        action = Action(kind, product, price) if kind in ("offer", "accept") else Action(kind)
        message = Message(SELLER, to, f"TALK-{to}-seller", action, "SELLER-THOUGHT")
        if state.seller_send(message) != to or state.done:
            continue
        check_buyer(to, message)
        other = market.products[k].id
        answer = {"bid": Action("bid", other, bid), "accept": Action("accept", product, price)}.get(reply, Action(reply))
        state.buyer_reply(to, Message(to, SELLER, f"TALK-{to}-reply", answer, f"BUYER-THOUGHT-{to}"))
    if not state.done:
        check_seller()
        for b in market.buyers:
            check_buyer(b.id, None)


# -- parsing and clamping model text ---------------------------------------------------------------------


def test_talk_is_cleaned_and_truncated_not_refused():
    long = "word " * 200
    text = f'Thought: ok\nTo: b1\nTalk: Hi\x07 there\x1b[31m {long}\nAction: [OFFER] p1 $450'
    result, notes, _ = parse_reply(text, SELLER)
    assert isinstance(result, Message)
    assert "\x07" not in result.talk and "\x1b" not in result.talk and len(result.talk) <= TALK_MAX
    assert result.talk.startswith("Hi there[31m word")
    # each repair is noted, in the order made: the control characters (now recorded too), then the cut
    assert notes == ["removed 2 control characters from talk: U+0007, U+001B", "talk truncated from 1012 to 600 characters"]
    data = '{"thought": "t", "to": "b1", "talk": "' + "x" * 900 + '", "action": {"kind": "offer", "product": "p1", "price": 450}}'
    result, notes, _ = parse_reply(data, SELLER)
    assert isinstance(result, Message) and len(result.talk) == TALK_MAX and notes


def test_json_with_raw_control_characters_a_fence_and_trailing_text_parses():
    text = '```json\n{"thought": "line one\nline two\x01", "to": "B2", "talk": "tab\there", "action": {"kind": "OFFER", "product": "P1", "price": "$450.6"}}\n```\nHope that helps!'
    result, notes, _ = parse_reply(text, SELLER)
    assert isinstance(result, Message), result
    assert (result.to, result.action) == ("b2", Action("offer", "p1", 451))
    assert result.talk == "tab here"


def test_think_blocks_addressees_and_copied_brackets():
    text = "<think>\nThe buyer seems keen.\n</think>\n\nThought: go\nTo: Buyer b3\nTalk: hello\nAction: <[OFFER] p2 $1,200>"
    result, notes, reasoning = parse_reply(text, SELLER)
    assert isinstance(result, Message), result
    assert (result.to, result.action) == ("b3", Action("offer", "p2", 1200))
    assert reasoning == "The buyer seems keen."
    assert any("read as b3" in note for note in notes)
    # A buyer's reply goes to the seller whatever it says, and a tagged agent still reads JSON.
    result, _, _ = parse_reply('{"to": "you", "talk": "ok", "action": {"kind": "accept", "product": "p1", "price": 300}}', "buyer", "b1")
    assert result == Message("b1", SELLER, "ok", Action("accept", "p1", 300))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I would like to offer p1 for $450.", "no 'Action:' line"),
        ('{"thought": "I will', "not valid JSON"),
        ("Thought: x\nTo: b1\nTalk: hi\nAction: [DANCE]", "'dance' is not one of"),
        ("To: b1\nAction: [OFFER] p1", "is not like"),
        ('{"to": "b1", "talk": "hi", "action": {"kind": "offer", "product": "p1", "price": -5}}', "negative"),
        ("", "no 'Action:' line"),
    ],
)
def test_what_does_not_parse_is_a_failure_with_the_raw_text(text, reason):
    result, _, _ = parse_reply(text, SELLER)
    assert isinstance(result, ParseFailure)
    assert reason in result.reason
    assert result.raw == text


# -- legal=1: the regex of the replies the rules allow -------------------------------------------------


def test_legal_pattern_by_hand():
    """The shapes market of an SFT evaluation, at the turn where the model offered a sold-out p1: b1 has
    bought p1, b2 owes a reply, b3 may be written to and has bid $480 on p3."""
    products = (ProductView("p1", "Pro", 420, 0), ProductView("p2", "Lite", 466, 1), ProductView("p3", "Basic", 473, 1))
    buyers = (BuyerView("b1", SERVED, False, None, None), BuyerView("b2", ACTIVE, True, ("p2", 495), None),
              BuyerView("b3", ACTIVE, False, None, ("p3", 480)))
    pattern = legal_pattern(SellerObservation(4, 14, 100, 1000, products, buyers, (), ()))

    def legal(text: str) -> bool:
        return re.fullmatch(pattern, text) is not None

    assert legal("To: b3\nTalk: It is yours for $571.\nAction: [OFFER] p2 $571")
    assert legal("Thought: start high\nTo: b3\nTalk: \nAction: [OFFER] p3 $473")  # at cost: allowed
    assert legal("To: b3\nTalk: Deal.\nAction: [ACCEPT] p3 $480")
    assert legal("To: b3\nTalk: No.\nAction: [REJECT]") and legal("To: b3\nTalk: Bye.\nAction: [END]")
    assert not legal("To: b3\nTalk: x\nAction: [OFFER] p1 $608")  # sold out
    assert not legal("To: b3\nTalk: x\nAction: [OFFER] p3 $472")  # below cost
    assert not legal("To: b3\nTalk: x\nAction: [OFFER] p3 $0473")  # a leading zero
    assert legal("To: b3\nTalk: x\nAction: [OFFER] p3 $1000")
    assert not legal("To: b3\nTalk: x\nAction: [OFFER] p3 $1001")  # above every value: no buyer takes it
    assert not legal("To: b3\nTalk: x\nAction: [ACCEPT] p3 $490")  # not its bid
    assert not legal("To: b2\nTalk: x\nAction: [REJECT]")  # owes a reply
    assert not legal("To: b1\nTalk: x\nAction: [REJECT]")  # has bought
    assert not legal("To: b3\nTalk: two\nlines\nAction: [END]")
    # Bounded lines (a model sampled hot ran an unbounded talk line to max_tokens): 80 characters of talk, 160 of thought.
    assert legal(f"To: b3\nTalk: {'x' * 80}\nAction: [END]") and not legal(f"To: b3\nTalk: {'x' * 81}\nAction: [END]")
    assert legal(f"Thought: {'y' * 160}\nTo: b3\nTalk: \nAction: [END]")
    assert not legal(f"Thought: {'y' * 161}\nTo: b3\nTalk: \nAction: [END]")
    everyone_waits = tuple(b._replace(awaiting=True) for b in buyers)
    assert legal_pattern(SellerObservation(4, 14, 100, 1000, products, everyone_waits, (), ())) is None


def test_the_grounded_pattern_by_hand():
    # The golden mid state: b1 is free and bids $700 for p2 (cost $500; p2's unit is free: the planner deals on it);
    # b2 owes a reply to an offer of p1, so p1's one unit is promised. 2 turns left for 2 active buyers.
    _, _, mid, _ = golden_states()
    pattern = grounded_pattern(observe(mid, SELLER))
    head = "Thought: b1 bids $700 (first bid, covers cost); 2 turns for 2 buyers: "

    def grounded(verdict, action, to="b1"):
        return re.fullmatch(pattern, f"{head}{verdict}\nTo: {to}\nTalk: x\nAction: {action}") is not None

    assert grounded("hold out", "[OFFER] p2 $701") and grounded("ask one step up", "[OFFER] p2 $1000")
    assert grounded("take it", "[ACCEPT] p2 $700")
    assert re.fullmatch(pattern, "Thought: no sale is worth its cost: end\nTo: b1\nTalk: \nAction: [END]")
    assert re.fullmatch(pattern, f"{head}take it\nTo: b1\nTalk: {'x' * 80}\nAction: [ACCEPT] p2 $700")
    assert not re.fullmatch(pattern, f"{head}take it\nTo: b1\nTalk: {'x' * 81}\nAction: [ACCEPT] p2 $700")  # talk is bounded
    assert not grounded("hold out", "[OFFER] p2 $700")  # holding out asks above the bid
    assert not grounded("take it", "[OFFER] p2 $800") and not grounded("hold out", "[ACCEPT] p2 $700")  # the verdict's action
    assert not grounded("below cost: ask more", "[OFFER] p2 $800")  # $700 covers the cost of $500
    assert not grounded("offer p1", "[OFFER] p1 $800")  # a bidder the planner deals with is asked about its bid's product
    assert not grounded("hold out", "[OFFER] p2 $800", to="b2") and not grounded("hold out", "[REJECT]")
    assert not re.fullmatch(pattern, "Thought: b1 bids $700 for p2, no deal there; 2 turns for 2 buyers: offer p2\nTo: b1\nTalk: x\n"
                                     "Action: [OFFER] p2 $800")  # not the facts
    assert not re.fullmatch(pattern, "To: b1\nTalk: x\nAction: [OFFER] p2 $800")  # a thought is a reason, always
    # b1's bid is for a product whose one unit b2 is being offered: no deal there, and b1 hears offers of what is left.
    m = golden_market()
    state = EpisodeState(Market(m.spec, m.seed, m.products, m.buyers, 16, m.price_low, m.price_high))
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 640)))
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("bid", "p1", 400)))
    state.seller_send(Message(SELLER, "b2", "", Action("offer", "p1", 600)))
    pattern = grounded_pattern(observe(state, SELLER))
    assert re.fullmatch(pattern, "Thought: b1 bids $400 for p1, no deal there; 14 turns for 2 buyers: offer p2\nTo: b1\nTalk: x\n"
                                 "Action: [OFFER] p2 $500")
    assert not re.fullmatch(pattern, "Thought: b1 bids $400 for p1, no deal there; 14 turns for 2 buyers: offer p1\nTo: b1\n"
                                     "Talk: x\nAction: [OFFER] p1 $500")  # p1's unit is promised to b2


@pytest.mark.parametrize(("low", "high"), [(0, 0), (0, 9), (1, 10), (9, 10), (99, 100), (100, 999), (466, 1000), (473, 1000),
                                           (5, 4321), (1000, 1999), (1234, 1234), (250, 10_000)])
def test_number_range_is_exactly_the_numbers_from_low_to_high(low, high):
    pattern = number_range(low, high)
    assert [k for k in range(0, 12_000) if re.fullmatch(pattern, str(k))] == list(range(low, min(high, 11_999) + 1))
    assert not re.fullmatch(pattern, f"0{low}")  # no leading zero


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**7))
def test_number_range_on_large_numbers(a, b, k):
    low, high = sorted((a, b))
    assert (re.fullmatch(number_range(low, high), str(k)) is not None) == (low <= k <= high)


@pytest.mark.parametrize("grounded", [False, True])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(markets_and_plays(), st.data())
def test_every_reply_the_legal_pattern_allows_is_one_the_regulator_accepts(grounded, case, data):
    """Replies drawn from the regex, at every seller turn of random plays, parse and break no rule; and
    the regex allows every offer at cost to a buyer that may be written to. Under ``grounded=1``, every reply
    drawn is one the legal regex allows, its thought is a reason with the facts prompt's facts, and its action
    is the one the reason's verdict names."""
    market, plays, _ = case
    state = EpisodeState(market)
    for (i, kind, j, price), (reply, k, bid) in plays:
        if state.done or state.budget_left <= 0:
            break
        obs = observe(state, SELLER)
        pattern = (grounded_pattern if grounded else legal_pattern)(obs)
        free = [b.id for b in obs.buyers if b.status == ACTIVE and not b.awaiting]
        assert (pattern is None) == (not free)
        if pattern is not None:
            for b in free if not grounded else ():
                for p in obs.products:
                    offer = f"To: {b}\nTalk: x\nAction: [OFFER] {p.id} ${p.cost}"
                    assert (re.fullmatch(pattern, offer) is not None) == (p.stock > 0)
                    assert re.fullmatch(pattern, f"To: {b}\nTalk: x\nAction: [OFFER] {p.id} ${p.cost - 1}") is None
                    assert re.fullmatch(pattern, f"To: {b}\nTalk: x\nAction: [OFFER] {p.id} ${obs.price_high + 1}") is None
            text = data.draw(st.from_regex(pattern, fullmatch=True), label="reply")
            message = parse_reply(text, SELLER, SELLER)[0]
            assert isinstance(message, Message), (text, message)
            if grounded:
                assert re.fullmatch(legal_pattern(obs), text)
                facts, turns, verdict = read_reason(message.thought)
                prompt = render_seller(obs, "tagged", "facts")[1]["content"]
                assert verdict == "end" or (f"{message.to}: free. {facts}\n" in prompt and prompt.splitlines()[1].startswith(f"{turns}: "))
                assert reason_action(verdict) == message.action.kind
            invalid = state.invalid_by[SELLER]
            to = state.seller_send(message)
            assert state.invalid_by[SELLER] == invalid, (text, state.events[-1])
        else:
            to = None
        if to is None or state.done or not any(b.id == to and b.awaiting for b in observe(state, SELLER).buyers):
            continue
        offered = message.action.kind == "offer"
        answer = {"bid": Action("bid", market.products[k].id, bid),
                  "accept": Action("accept", message.action.product, message.action.price) if offered else Action("reject")}.get(reply, Action(reply))
        state.buyer_reply(to, Message(to, SELLER, "", answer))
