"""negotiate.protocol: the four-part message, its two wire forms, and parse failures."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from negotiate.protocol import (
    BUYER,
    BUYER_ACTIONS,
    SELLER,
    SELLER_ACTIONS,
    TALK_MAX,
    Action,
    BuyerStatus,
    Message,
    ParseFailure,
    Role,
    CONTROL,
    json_schema,
    one_line,
    parse,
    parse_json,
    parse_lenient,
    parse_tagged,
    render_tagged,
)
from negotiate.protocol import message_from_dict

# -- tagged text ---------------------------------------------------------------------

SELLER_TAGGED = [
    ("Thought: start high\nTo: b2\nTalk: The Pro is yours for $450.\nAction: [OFFER] p2 $450", Action("offer", "p2", 450), "b2"),
    ("To: b1\nTalk: Deal.\nAction: [ACCEPT] p1 $300", Action("accept", "p1", 300), "b1"),
    ("To: b3\nTalk: No.\nAction: [REJECT]", Action("reject"), "b3"),
    ("Talk: Goodbye.\nAction: [END]", Action("end"), ""),
    # lenient spellings: lower case, no brackets, "for", thousands separators, decimals rounded
    ("to: B4\naction: offer p10 for $1,250", Action("offer", "p10", 1250), "b4"),
    ("To: b1\nAction: [offer] P3 $99.6", Action("offer", "p3", 100), "b1"),
    ("To: b1\nAction: [OFFER] p1 @ 75.", Action("offer", "p1", 75), "b1"),
]

BUYER_TAGGED = [
    ("Thought: too much\nTo: seller\nTalk: I can do $300.\nAction: [BID] p2 $300", Action("bid", "p2", 300)),
    ("Talk: Deal.\nAction: [ACCEPT] p1 $450", Action("accept", "p1", 450)),
    ("Action: [REJECT]", Action("reject")),
    ("Talk: Bye.\nAction: [QUIT]", Action("quit")),
    ("action: bid p1 at 0", Action("bid", "p1", 0)),
]


@pytest.mark.parametrize(("text", "action", "to"), SELLER_TAGGED)
def test_parse_tagged_seller_actions(text, action, to):
    message = parse(text, SELLER)
    assert isinstance(message, Message)
    assert message.action == action
    assert message.to == to
    assert message.sender == SELLER
    assert parse_tagged(text, SELLER) == message


@pytest.mark.parametrize(("text", "action"), BUYER_TAGGED)
def test_parse_tagged_buyer_actions(text, action):
    message = parse(text, "buyer", sender="b2")
    assert isinstance(message, Message)
    assert message.action == action
    assert message.sender == "b2"
    assert message.to == SELLER  # a buyer always writes to the seller, whatever To: says


def test_tagged_parts_are_split_into_thought_talk_and_action():
    text = "Thought: b2 values p2 most.\nIt can wait.\nTo: b2\nTalk: Line one.\nLine two.\nAction: [OFFER] p2 $450\n"
    message = parse(text, SELLER)
    assert message.thought == "b2 values p2 most.\nIt can wait."
    assert message.talk == "Line one.\nLine two."
    assert message.to == "b2"


def test_buyer_to_is_always_the_seller():
    message = parse("To: b7\nAction: [REJECT]", "buyer", "b1")
    assert message.to == SELLER


# -- JSON ------------------------------------------------------------------------------


def _json(action: dict, **rest) -> str:
    return orjson.dumps({"thought": "t", "talk": "hello", **rest, "action": action}).decode()


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ({"kind": "offer", "product": "p2", "price": 450}, Action("offer", "p2", 450)),
        ({"kind": "accept", "product": "p1", "price": 300}, Action("accept", "p1", 300)),
        ({"kind": "reject"}, Action("reject")),
        ({"kind": "end", "product": None, "price": None}, Action("end")),
        ({"type": "OFFER", "product": "P3", "price": "1,000"}, Action("offer", "p3", 1000)),
        ({"kind": "offer", "product": "p1", "price": 12.4}, Action("offer", "p1", 12)),
    ],
)
def test_parse_json_seller_actions(action, expected):
    message = parse(_json(action, to="b1"), SELLER)
    assert isinstance(message, Message)
    assert message.action == expected
    assert message.thought == "t" and message.talk == "hello"
    assert parse_json(_json(action, to="b1"), SELLER) == message


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ({"kind": "bid", "product": "p2", "price": 300}, Action("bid", "p2", 300)),
        ({"kind": "accept", "product": "p1", "price": 450}, Action("accept", "p1", 450)),
        ({"kind": "reject"}, Action("reject")),
        ({"kind": "quit"}, Action("quit")),
    ],
)
def test_parse_json_buyer_actions(action, expected):
    message = parse(_json(action, to="seller"), "buyer", "b3")
    assert isinstance(message, Message)
    assert message.action == expected
    assert (message.sender, message.to) == ("b3", SELLER)


def test_json_in_a_code_fence():
    text = "```json\n" + _json({"kind": "offer", "product": "p1", "price": 5}, to="b1") + "\n```"
    assert parse(text, SELLER).action == Action("offer", "p1", 5)


def test_tagged_and_json_forms_parse_to_the_same_record():
    tagged = parse("Thought: t\nTo: b1\nTalk: hello\nAction: [OFFER] p2 $450", SELLER)
    as_json = parse(_json({"kind": "offer", "product": "p2", "price": 450}, to="b1"), SELLER)
    assert tagged == as_json


# -- failures ------------------------------------------------------------------------------

SELLER_FAILURES = [
    ("", "no 'Action:'"),
    ("To: b1\nTalk: hi", "no 'Action:'"),
    ("To: b1\nAction: make an offer", "not like"),
    ("To: b1\nAction: [OFFER]", "needs a product and a price"),
    ("To: b1\nAction: [OFFER] p1", "not like"),
    ("To: b1\nAction: [OFFER] $100", "not like"),
    ("To: b1\nAction: [OFFER] p1 $-5", "negative"),
    ("To: b1\nAction: [BID] p1 $5", "not one of offer, accept, reject, end"),
    ("To: b1\nAction: [QUIT]", "not one of"),
    ("Action: [OFFER] p1 $5", "no addressee"),
    ("To: b1\nAction: [OFFER] p1 $99999999999999", "not a number"),
    ('{"to": "b1"}', "no 'action'"),
    ('{"to": "b1", "action": {"product": "p1"}}', "no 'kind'"),
    ('{"to": "b1", "action": {"kind": "offer", "product": "p1", "price": "cheap"}}', "not a number"),
    ('{"to": "b1", "action": {"kind": "offer", "product": "p1", "price": true}}', "not a number"),
    ('{"to": "b1", "action": {"kind": "offer", "product": "p1", "price": [1]}}', "not a number"),
    ('{"to": "b1", "action": {"kind": "offer", "product": 1, "price": 5}}', "not a product id"),
    ('{"to": "b1", "action": {"kind": "offer", "product": "shoe", "price": 5}}', "not a product id"),
    ('{"to": "b1", "action": {"kind": "offer", "product": "p1", "price": -1}}', "negative"),
    ('{"to": 3, "action": {"kind": "reject"}}', "'to' is not a string"),
    ('{"action": {"kind": "reject"}}', "no addressee"),
    ('{"to": "b1", "action": {"kind": "reject"', "not valid JSON"),
    ("```json\nnope\n```", "not valid JSON"),
]


@pytest.mark.parametrize(("text", "reason"), SELLER_FAILURES)
def test_seller_parse_failures_have_a_reason(text, reason):
    result = parse(text, SELLER)
    assert isinstance(result, ParseFailure)
    assert not result  # a ParseFailure is falsy
    assert reason in result.reason
    assert result.raw == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Action: [OFFER] p1 $5", "not one of bid, accept, reject, quit"),
        ("Action: [END]", "not one of bid, accept, reject, quit"),
        ('{"action": {"kind": "end"}}', "not one of"),
        ("Action: [BID]", "needs a product and a price"),
        ("Action: [ACCEPT] p1 $-1", "negative"),
    ],
)
def test_buyer_parse_failures_and_wrong_role_actions(text, reason):
    result = parse(text, "buyer", "b1")
    assert isinstance(result, ParseFailure)
    assert reason in result.reason


def test_json_that_is_not_an_object():
    result = parse_json("[1, 2]", SELLER)
    assert isinstance(result, ParseFailure) and "not an object" in result.reason


def test_talk_longer_than_talk_max_fails_and_talk_max_itself_passes():
    ok = "x" * TALK_MAX
    assert isinstance(parse(f"To: b1\nTalk: {ok}\nAction: [REJECT]", SELLER), Message)
    result = parse(f"To: b1\nTalk: {ok}y\nAction: [REJECT]", SELLER)
    assert isinstance(result, ParseFailure) and str(TALK_MAX) in result.reason
    result = parse(_json({"kind": "reject"}, to="seller", talk=ok + "y"), "buyer", "b1")
    assert isinstance(result, ParseFailure) and "more than" in result.reason


def test_markdown_bold_tags_parse():
    message = parse("**To:** b1\n**Talk:** hi\n**Action:** [OFFER] p2 $450", SELLER)
    assert isinstance(message, Message)
    assert message.to == "b1" and message.action == Action("offer", "p2", 450)


def test_markdown_bold_tags_with_colon_outside_parse():
    message = parse("**To**: b1\n**Action**: [OFFER] p2 $450", SELLER)
    assert isinstance(message, Message) and message.to == "b1"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), role=st.sampled_from([SELLER, "buyer"]))
def test_parse_never_raises_on_arbitrary_text(text, role):
    result = parse(text, role, None if role == SELLER else "b1")
    assert isinstance(result, (Message, ParseFailure))
    if isinstance(result, ParseFailure):
        assert result.reason and result.raw == text
    else:
        assert result.action.kind in (SELLER_ACTIONS if role == SELLER else BUYER_ACTIONS)


_TAG_WORDS = st.sampled_from(["Thought:", "To:", "Talk:", "Action:", "**Action**:", "[OFFER]", "[BID]", "[ACCEPT]",
                              "[REJECT]", "[END]", "[QUIT]", "p1", "p12", "$", "$1,000", "-3", ".5", "b1", "seller",
                              "\n", " ", "{", "}", "```", "json", '"kind"', ":", "offer", "at", "@"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_TAG_WORDS | st.text(max_size=8), max_size=25), role=st.sampled_from([SELLER, "buyer"]))
def test_parse_never_raises_on_near_miss_text(parts, role):
    text = "".join(parts)
    assert isinstance(parse(text, role, "b1"), (Message, ParseFailure))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.fixed_dictionaries(
        {},
        optional={
            "to": _JSON | st.sampled_from(["b1", "seller", ""]),
            "talk": _JSON,
            "thought": _JSON,
            "action": _JSON | st.fixed_dictionaries(
                {"kind": _JSON | st.sampled_from(list(SELLER_ACTIONS + BUYER_ACTIONS))},
                optional={"product": _JSON | st.sampled_from(["p1", "P2", "p", "x1"]), "price": _JSON},
            ),
        },
    ),
    role=st.sampled_from([SELLER, "buyer"]),
)
def test_parse_never_raises_on_arbitrary_json(body, role):
    try:
        text = orjson.dumps(body).decode()
    except orjson.JSONEncodeError:  # integers beyond 64 bits: write them by hand
        text = repr(body)
    result = parse(text, role, "b1")
    assert isinstance(result, (Message, ParseFailure))


# -- round trips ------------------------------------------------------------------------------

_PLAIN = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "Zs"), exclude_characters="\r\n\t"), max_size=40)
_TALK = _PLAIN.map(str.strip)


@st.composite
def messages(draw, role: str):
    kinds = SELLER_ACTIONS if role == SELLER else BUYER_ACTIONS
    kind = draw(st.sampled_from(kinds))
    if kind in ("offer", "accept", "bid"):
        action = Action(kind, f"p{draw(st.integers(1, 40))}", draw(st.integers(0, 10**9)))
    else:
        action = Action(kind)
    if role == SELLER:
        sender, to = SELLER, "" if kind == "end" else f"b{draw(st.integers(1, 40))}"
    else:
        sender, to = f"b{draw(st.integers(1, 40))}", SELLER
    return Message(sender, to, draw(_TALK), action, draw(_TALK))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), role=st.sampled_from([SELLER, "buyer"]))
def test_render_tagged_then_parse_round_trips(data, role):
    message = data.draw(messages(role))
    assert parse(render_tagged(message), SELLER if role == SELLER else "buyer", message.sender) == message


@settings(max_examples=200, deadline=None)
@given(data=st.data(), role=st.sampled_from([SELLER, "buyer"]))
def test_json_form_round_trips(data, role):
    message = data.draw(messages(role))
    body = message.to_dict()
    body.pop("sender")
    assert parse(orjson.dumps(body).decode(), SELLER if role == SELLER else "buyer", message.sender) == message
    assert message_from_dict(message.to_dict()) == message


@settings(max_examples=200, deadline=None)
@given(data=st.data(), role=st.sampled_from([SELLER, "buyer"]), fmt=st.sampled_from(["tagged", "json"]))
def test_the_lenient_parser_reads_clean_text_as_parse_does(data, role, fmt):
    # On text parse accepts, the lenient parser returns the same message, and notes nothing; the only
    # difference is the talk made one line (runs of spaces collapsed).
    message = data.draw(messages(role))
    if fmt == "tagged":
        text = render_tagged(message)
    else:
        text = orjson.dumps({k: v for k, v in message.to_dict().items() if k != "sender"}).decode()
    result, notes, reasoning = parse_lenient(text, role, message.sender)
    assert (result, notes, reasoning) == (message._replace(talk=one_line(message.talk)), [], None)
    if message.talk == one_line(message.talk):
        assert result == parse(text, role, message.sender)


def test_control_characters_are_one_set_tab_and_line_breaks_kept():
    text = "a\x00b\x07c\x1b[31md\x7fe\x85f\x9fg\th\ni\rj"
    assert CONTROL.sub("", text) == "abc[31mdefg\th\ni\rj"
    # The lenient parser strips them from every part, thought included (C1 too), before reading.
    result, _, _ = parse_lenient("Thought: x\x9b1my\nTo: b1\nTalk: hi\x1b[0m\nAction: [OFFER] p1 $5", SELLER)
    assert (result.thought, result.talk) == ("x1my", "hi[0m")


def test_json_escaped_control_characters_are_removed_like_raw_ones_and_noted():
    # \u0007 (bell), \u001b (escape), C1 \u0085 and \u009b (CSI), escaped in the JSON: gone from thought and talk,
    # and each part's repair noted (how many, which, where), as the traces README says extra.clamped holds.
    text = ('{"thought": "a\\u0007b\\u001b[31mc\\u0085d\\u009b1m", "to": "b1", "talk": "hi\\u001b[0m there",'
            ' "action": {"kind": "offer", "product": "p1", "price": 5}}')
    result, notes, _ = parse_lenient(text, SELLER)
    assert (result.thought, result.talk) == ("ab[31mcd1m", "hi[0m there")
    assert notes == ["removed 4 control characters from thought: U+0007, U+001B, U+0085, U+009B",
                     "removed 1 control character from talk: U+001B"]
    # The same characters raw (inside the strings) give the same message and the same notes.
    raw = text.replace("\\u0007", "\x07").replace("\\u001b", "\x1b").replace("\\u0085", "\x85").replace("\\u009b", "\x9b")
    assert "\\u" not in raw
    assert parse_lenient(raw, SELLER) == (result, notes, None)


def test_raw_control_characters_in_the_tagged_form_are_noted_by_the_part_they_were_in():
    text = "<think>keen\x07</think>Thought: x\x9b1my\nTo: b1\x07\n\x1bTalk: hi\x1b[0m\x1b\nAction: [OFFER] p1 $5"
    result, notes, reasoning = parse_lenient(text, SELLER)
    assert (result.thought, result.to, result.talk, reasoning) == ("x1my", "b1", "hi[0m", "keen")
    # The escape before "Talk:" stood at the end of the To line: it is the To part's.
    assert notes == ["removed 1 control character from reasoning: U+0007",
                     "removed 1 control character from thought: U+009B",
                     "removed 2 control characters from to: U+0007, U+001B",
                     "removed 2 control characters from talk: U+001B"]


def test_control_characters_between_json_tokens_are_removed_before_reading_and_noted():
    result, notes, _ = parse_lenient('{"to": "b1",\x07 "talk": "hi", "action": {"kind": "offer", "product": "p1", "price": "$5\x1b"}}', SELLER)
    assert result == Message(SELLER, "b1", "hi", Action("offer", "p1", 5))
    assert notes == ["removed 2 control characters from the reply, before its JSON was read: U+0007, U+001B"]


_CONTROLS = st.sampled_from(["\x00", "\x07", "\x1b", "\x7f", "\x85", "\x9b", "\x9f"])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), role=st.sampled_from([SELLER, "buyer"]))
def test_control_characters_raw_or_escaped_leave_the_same_message_and_notes(data, role):
    # Insert control characters into a clean message's thought and talk; written raw or JSON-escaped, the
    # lenient parser returns the message without them, with one note per part: count and code points.
    message = data.draw(messages(role))
    body = {k: v for k, v in message.to_dict().items() if k != "sender"}
    chars, expected = [], []
    for key in ("thought", "talk"):  # the order they are written in
        inserted = sorted(data.draw(st.lists(st.tuples(st.integers(0, len(body[key])), _CONTROLS),
                                             max_size=4, unique_by=lambda pair: pair[0])))
        value = body[key]
        for position, _ in reversed(inserted):
            value = value[:position] + "\ue000" + value[position:]  # a placeholder, filled in below
        body[key] = value
        chars += [char for _, char in inserted]
        if inserted:
            codes = ", ".join(f"U+{ord(char):04X}" for char in dict.fromkeys(char for _, char in inserted))
            expected.append(f"removed {len(inserted)} control character{'s' if len(inserted) > 1 else ''} from {key}: {codes}")
    template = orjson.dumps(body).decode()
    raw = re.sub("\ue000", lambda _, filled=iter(chars): next(filled), template)
    escaped = re.sub("\ue000", lambda _, filled=iter(chars): f"\\u{ord(next(filled)):04x}", template)
    result = parse_lenient(raw, role, message.sender)
    assert result == (message._replace(talk=one_line(message.talk)), expected, None)
    assert parse_lenient(escaped, role, message.sender) == result


def test_the_lenient_parser_reads_a_tag_inside_talk_once():
    # Cut at its tags once: a talk that quotes the format ("To: b1") is talk, and the clamps apply
    # to what was cut, not to a rebuilt text read a second time.
    text = "To: b2\nTalk: I said To: b1 earlier\nAction: [OFFER] p1 $100"
    result, notes, _ = parse_lenient(text, SELLER)
    assert result == parse(text, SELLER) == Message(SELLER, "b2", "I said To: b1 earlier", Action("offer", "p1", 100))
    assert notes == []


def test_lenient_failures_keep_the_text_verbatim():
    text = "<think>hmm</think>\n{\"to\": \"b1\", \"action\": {\"kind\": \"offer\"}}"
    result, notes, reasoning = parse_lenient(text, SELLER)
    assert isinstance(result, ParseFailure) and result.raw == text
    assert result.reason == "action offer needs a product and a price" and reasoning == "hmm"
    result, _, _ = parse_lenient("```json\n[1, 2]\n```", SELLER)
    assert result.reason == "JSON is not an object"


def test_render_tagged_pinned():
    message = Message(SELLER, "b2", "The Pro is yours for $450.", Action("offer", "p2", 450), "start high")
    assert render_tagged(message) == (
        "Thought: start high\nTo: b2\nTalk: The Pro is yours for $450.\nAction: [OFFER] p2 $450"
    )
    assert render_tagged(Message("b1", SELLER, "No.", Action("reject"))) == "To: seller\nTalk: No.\nAction: [REJECT]"


# -- JSON schema ------------------------------------------------------------------------------


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if ref:
        assert ref.startswith("#/$defs/")
        return root["$defs"][ref.removeprefix("#/$defs/")]
    return schema


def _validate(instance, schema: dict, root: dict) -> list[str]:
    """The subset of JSON Schema that json_schema() uses (fallback when `jsonschema` is absent)."""
    schema = _resolve(schema, root)
    if "anyOf" in schema:
        return [] if any(not _validate(instance, s, root) for s in schema["anyOf"]) else [f"{instance!r}: no anyOf branch"]
    errors = []
    kind = schema.get("type")
    checks = {"object": dict, "string": str, "integer": int, "null": type(None)}
    if kind in checks and (not isinstance(instance, checks[kind]) or (kind == "integer" and isinstance(instance, bool))):
        return [f"{instance!r} is not {kind}"]
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{instance!r} not in {schema['enum']}")
    if "pattern" in schema and not re.search(schema["pattern"], instance):
        errors.append(f"{instance!r} does not match {schema['pattern']}")
    if "minimum" in schema and instance < schema["minimum"]:
        errors.append(f"{instance!r} < {schema['minimum']}")
    if "maxLength" in schema and len(instance) > schema["maxLength"]:
        errors.append(f"{instance!r} too long")
    if kind == "object":
        for name in schema.get("required", []):
            if name not in instance:
                errors.append(f"missing {name}")
        for name, sub in schema.get("properties", {}).items():
            if name in instance:
                errors.extend(_validate(instance[name], sub, root))
        if schema.get("additionalProperties") is False:
            errors.extend(f"extra {k}" for k in instance if k not in schema.get("properties", {}))
    return errors


def _schema_errors(instance: dict, schema: dict) -> list[str]:
    try:
        import jsonschema
    except ImportError:
        return _validate(instance, schema, schema)
    return [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(instance)]


@pytest.mark.parametrize("role", [SELLER, "buyer"])
def test_json_schema_has_the_roles_action_kinds_only(role):
    schema = json_schema(role)
    kinds = schema["$defs"]["Action"]["properties"]["kind"]["enum"]
    assert kinds == list(SELLER_ACTIONS if role == SELLER else BUYER_ACTIONS)
    assert "sender" not in schema["properties"]
    assert set(schema["required"]) == {"thought", "to", "talk", "action"}
    assert schema["properties"]["talk"]["maxLength"] == TALK_MAX


def test_json_schema_calls_do_not_leak_into_each_other():
    buyer = json_schema("buyer")
    seller = json_schema(SELLER)
    assert buyer["properties"]["to"]["enum"] == [SELLER]
    assert "enum" not in seller["properties"]["to"]
    assert "bid" not in seller["$defs"]["Action"]["properties"]["kind"]["enum"]
    assert "offer" not in json_schema("buyer")["$defs"]["Action"]["properties"]["kind"]["enum"]


@pytest.mark.parametrize(
    ("role", "body"),
    [
        (SELLER, {"thought": "t", "to": "b1", "talk": "hi", "action": {"kind": "offer", "product": "p2", "price": 450}}),
        (SELLER, {"thought": "", "to": "b3", "talk": "", "action": {"kind": "reject", "product": None, "price": None}}),
        (SELLER, {"thought": "", "to": "", "talk": "bye", "action": {"kind": "end"}}),
        ("buyer", {"thought": "t", "to": "seller", "talk": "hi", "action": {"kind": "bid", "product": "p1", "price": 10}}),
        ("buyer", {"thought": "", "to": "seller", "talk": "", "action": {"kind": "quit"}}),
    ],
)
def test_a_message_valid_under_the_schema_parses_back(role, body):
    schema = json_schema(role)
    assert _schema_errors(body, schema) == []
    message = parse(orjson.dumps(body).decode(), role, None if role == SELLER else "b1")
    assert isinstance(message, Message)
    assert message.action.to_dict() == {"kind": body["action"]["kind"], "product": body["action"].get("product"),
                                        "price": body["action"].get("price")}


@pytest.mark.parametrize(
    ("role", "body"),
    [
        (SELLER, {"thought": "", "to": "b1", "talk": "", "action": {"kind": "bid", "product": "p1", "price": 1}}),
        ("buyer", {"thought": "", "to": "seller", "talk": "", "action": {"kind": "offer", "product": "p1", "price": 1}}),
        ("buyer", {"thought": "", "to": "b2", "talk": "", "action": {"kind": "quit"}}),
        (SELLER, {"thought": "", "to": "b1", "talk": "", "action": {"kind": "offer", "product": "x", "price": 1}}),
        (SELLER, {"thought": "", "to": "b1", "talk": "", "action": {"kind": "offer", "product": "p1", "price": -1}}),
        (SELLER, {"to": "b1", "talk": "", "action": {"kind": "reject"}}),
    ],
)
def test_schema_rejects_what_the_role_may_not_send(role, body):
    assert _schema_errors(body, json_schema(role)) != []


def test_protocol_doctests_pass():
    import doctest

    import negotiate.protocol

    result = doctest.testmod(negotiate.protocol, report=False)
    assert result.attempted >= 3 and result.failed == 0


def test_roles_and_statuses_are_the_strings_the_trace_holds():
    assert (SELLER, BUYER) == (Role.SELLER, Role.BUYER) == ("seller", "buyer")
    assert f"{SELLER} {BUYER}" == "seller buyer" and {"seller": 1}[SELLER] == 1
    assert [status.value for status in BuyerStatus] == ["active", "served", "gone"]
    message = Message(SELLER, "b1", "hi", Action("offer", "p1", 5))
    assert orjson.dumps(message.to_dict()) == (
        b'{"sender":"seller","to":"b1","thought":"","talk":"hi","action":{"kind":"offer","product":"p1","price":5}}')
    assert parse("To: seller\nAction: [REJECT]", BUYER, "b1") == Message("b1", SELLER, "", Action("reject"))
