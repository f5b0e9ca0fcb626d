"""negotiate.trace: whole-episode JSONL writes, reading back with clear errors, scanning a killed run."""

from __future__ import annotations

import anyio
import orjson
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.episode import SCHEMA_VERSION, run_episode
from negotiate.errors import UserError
from negotiate.market import SPLITS
from negotiate.metrics import metrics_from_events
from negotiate.runner import build_episode
from negotiate.trace import TraceWriter, count_complete, drop_failed, read_episodes, read_records, scan, trace_files


def tiny(episode: str, schema: int = SCHEMA_VERSION, **extra) -> list[dict]:
    return [
        {"type": "episode_start", "schema": schema, "episode": episode, **extra},
        {"type": "message", "episode": episode, "sender": "seller", "turn": 1},
        {"type": "episode_end", "episode": episode, "outcome": "terminated", "metrics": {"profit": 1}},
    ]


@pytest.fixture(scope="module")
def real_episodes():
    async def play():
        out = []
        for index in range(3):
            market, s, b = build_episode(SPLITS["train"], parse_agent("greedy", "seller"), parse_agent("concession", "buyer"), 0, index)
            out.append(await run_episode(market, s, b, episode_id=f"greedy-{index}"))
        return out

    return anyio.run(play)


def test_write_then_read_round_trips(tmp_path):
    path = tmp_path / "sub" / "t.jsonl"  # the writer makes the folder
    with TraceWriter(path) as writer:
        writer.write(tiny("a"))
        writer.write(tiny("b"))
        assert writer.episodes == 2
    assert list(read_episodes(path)) == [tiny("a"), tiny("b")]
    assert path.read_bytes().count(b"\n") == 6  # one event per line


def test_writer_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as writer:
        writer.write(tiny("a"))
    with TraceWriter(path, fsync=True) as writer:
        writer.write(tiny("b"))
    assert [e[0]["episode"] for e in read_episodes(path)] == ["a", "b"]


def test_a_real_trace_alone_recomputes_the_metrics(tmp_path, real_episodes):
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as writer:
        for episode in real_episodes:
            writer.write(episode.events)
    back = list(read_records(path))
    assert [b.events for b in back] == [episode.events for episode in real_episodes]  # typed records, field for field
    assert [metrics_from_events(events) for events in read_episodes(path)] == [episode.metrics for episode in real_episodes]


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n\n" for e in tiny("a")))
    assert list(read_episodes(path)) == [tiny("a")]


def _write_lines(path, events, tail: bytes = b"") -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events) + tail)


def test_a_truncated_last_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    half = orjson.dumps(tiny("b")[0])[:20]
    _write_lines(path, tiny("a") + tiny("b")[:2], half)  # lines 1-3: a; 4-5: b; 6: half a line
    with pytest.raises(UserError) as caught:
        list(read_episodes(path))
    message = str(caught.value)
    assert f"{path}:6" in message
    assert "\n" not in message
    # allow_partial keeps the complete episodes and drops the tail
    assert [e[0]["episode"] for e in read_episodes(path, allow_partial=True)] == ["a"]


def test_allow_partial_does_not_hide_a_corrupt_middle_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in tiny("a")) + b"{corrupt\n"
                     + b"".join(orjson.dumps(e) + b"\n" for e in tiny("b") + tiny("c")))
    try:
        got = [events[0]["episode"] for events in read_episodes(path, allow_partial=True)]
    except UserError:
        return  # refusing is fine too: only a half-written *tail* may be skipped
    assert got == ["a", "b", "c"]


def test_an_episode_without_its_end_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a") + tiny("b")[:2])  # complete lines, but b never ends
    with pytest.raises(UserError, match="no episode_end") as caught:
        list(read_episodes(path))
    assert f"{path}:4" in str(caught.value) and "'b'" in str(caught.value)
    assert [e[0]["episode"] for e in read_episodes(path, allow_partial=True)] == ["a"]


def test_an_episode_start_inside_another_episode_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a")[:2] + tiny("b"))
    with pytest.raises(UserError, match="no episode_end"):
        list(read_episodes(path))


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([{"type": "message"}], "before any episode_start"),
        ([{"no": "type"}], "no 'type'"),
        ([[1, 2]], "not a JSON object"),
        ([{"type": "episode_start", "episode": "a"}], "schema"),
        ([{"type": "episode_start", "schema": "1", "episode": "a"}], "schema"),
    ],
)
def test_malformed_events_are_user_errors(tmp_path, events, match):
    path = tmp_path / "t.jsonl"
    _write_lines(path, events)
    with pytest.raises(UserError, match=match) as caught:
        list(read_episodes(path))
    assert f"{path}:1" in str(caught.value)


@pytest.mark.parametrize(("labels", "line"), [
    ({"episode": None}, "episode: missing or null; every episode has an id, a non-empty string"),
    ({"episode": ""}, "episode: '': every episode has an id, a non-empty string"),
    ({"episode": 5}, "episode: 5: every episode has an id, a non-empty string"),
    ({"market": 5}, "market: 5: must be a JSON object"),  # replay --text printed it as "budget ? turns"
    ({"spec": [1]}, "spec: [1]: must be a JSON object"),
    ({"split": {}}, "split: {}: must be a string"),  # report: TypeError: unhashable type
    ({"run": [1]}, "run: [1]: must be a string"),
    ({"seller": 5}, "seller: 5: must be a string"),
    ({"index": "x"}, "index: 'x': must be a whole number"),
    ({"run_seed": True}, "run_seed: True: must be a whole number"),
    ({"seed": 1.5}, "seed: 1.5: must be a whole number"),
])
def test_an_episode_start_whose_id_or_labels_are_of_another_kind_is_refused_where_it_is(tmp_path, labels, line):
    """Issue 51: what every reader (report, replay, --resume, training) takes from an episode_start is checked once, as the
    file is read: an episode of null id was reported, a market of 5 replayed."""
    path = tmp_path / "t.jsonl"
    first = tiny("a")
    first[0] |= labels
    _write_lines(path, tiny("z") + first)
    for read in (lambda: list(read_episodes(path)), lambda: list(read_records(path)), lambda: scan(path)):
        with pytest.raises(UserError) as caught:
            read()
        assert str(caught.value) == f"{path}:4: {line}"


def test_labels_that_are_absent_or_null_are_no_error(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a", run=None, market=None, index=None, split=None))
    assert [events[0]["episode"] for events in read_episodes(path)] == ["a"]


def test_a_newer_schema_is_a_user_error(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a") + tiny("b", schema=SCHEMA_VERSION + 1))
    with pytest.raises(UserError) as caught:
        list(read_episodes(path))
    message = str(caught.value)
    assert f"{path}:4" in message and "schema" in message and "newer" in message
    with pytest.raises(UserError, match="newer"):
        scan(path)


def test_a_missing_trace_file(tmp_path):
    with pytest.raises(UserError, match="no such trace file"):
        list(read_episodes(tmp_path / "nope.jsonl"))


# -- scan ----------------------------------------------------------------------------------------


def test_scan_of_a_complete_file(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a", index=0) + tiny("b", index=1))
    result = scan(path)
    assert result.complete == [("a", 0, "terminated"), ("b", 1, "terminated")]
    assert result.good_bytes == path.stat().st_size
    assert result.partial is None


def test_scan_of_a_file_with_a_half_written_tail(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a"))
    good = path.stat().st_size
    with open(path, "ab") as handle:
        handle.write(b"".join(orjson.dumps(e) + b"\n" for e in tiny("b")[:2]) + orjson.dumps(tiny("b")[2])[:15])
    result = scan(path)
    assert [s.episode for s in result.complete] == ["a"]
    assert result.good_bytes == good
    assert result.partial == "b"


def test_drop_failed_takes_out_the_failed_episodes_and_keeps_every_other_byte(tmp_path):
    path = tmp_path / "t.jsonl"
    failed = tiny("b")
    failed[-1] = failed[-1] | {"outcome": "failed", "reason": "LLMError: down"}
    _write_lines(path, tiny("a"))
    a = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(b"".join(orjson.dumps(e) + b"\n" for e in failed))
    c = b"".join(orjson.dumps(e) + b"\n" for e in tiny("c"))
    with open(path, "ab") as handle:
        handle.write(b"\n" + c)  # a blank line between episodes stays with the episode after it
    assert drop_failed(path) == 1
    assert path.read_bytes() == a + b"\n" + c
    assert drop_failed(path) == 0 and path.read_bytes() == a + b"\n" + c  # nothing failed: the file is left alone
    assert [s.episode for s in scan(path).complete] == ["a", "c"]


def test_scan_of_a_tail_of_whole_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a"))
    good = path.stat().st_size
    with open(path, "ab") as handle:
        handle.write(orjson.dumps(tiny("b")[0]) + b"\n")
    result = scan(path)
    assert (result.good_bytes, result.partial) == (good, "b")


@pytest.mark.parametrize("chunk", [1, 7, 1 << 24])
def test_count_complete_counts_whole_episode_ends_as_scan_does(tmp_path, chunk):
    path = tmp_path / "t.jsonl"
    talk = tiny("b")
    talk[1] = talk[1] | {"talk": '{"type":"episode_end"}\n{"type":"episode_end"}'}  # in a string: escaped, not a line
    _write_lines(path, tiny("a") + talk)
    with open(path, "ab") as handle:
        handle.write(b"\n" + b"".join(orjson.dumps(e) + b"\n" for e in tiny("c")[:-1]) + orjson.dumps(tiny("c")[-1]))  # no newline
    assert (count_complete(path, chunk=chunk), len(scan(path).complete)) == (2, 2)
    with open(path, "ab") as handle:
        handle.write(b"\n")  # the last line whole: c is complete
    assert (count_complete(path, chunk=chunk), len(scan(path).complete)) == (3, 3)
    assert count_complete(tmp_path / "none.jsonl") == 0


def test_scan_of_a_missing_file(tmp_path):
    result = scan(tmp_path / "none.jsonl")
    assert (result.complete, result.good_bytes, result.partial) == ([], 0, None)


def test_scan_of_a_corrupt_middle_line_is_a_user_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"{not json\n" + b"".join(orjson.dumps(e) + b"\n" for e in tiny("a")))
    with pytest.raises(UserError, match=f"{path}:1"):
        scan(path)


def test_scan_of_a_non_object_line_is_a_user_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"[1, 2]\n")
    with pytest.raises(UserError):
        scan(path)


def test_scan_skips_blank_lines_like_read_episodes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n\n" for e in tiny("a")))
    assert len(list(read_episodes(path))) == 1
    assert [s.episode for s in scan(path).complete] == ["a"]


# -- trace_files ------------------------------------------------------------------------------------


def test_trace_files_expands_folders_and_skips_logs(tmp_path):
    (tmp_path / "run" / "deep").mkdir(parents=True)
    for name in ("run/b.jsonl", "run/a.jsonl", "run/deep/c.jsonl", "run/serve.log.jsonl", "run/notes.txt", "run/deep/metrics.jsonl"):
        (tmp_path / name).write_text("")
    found = trace_files([tmp_path / "run"])  # a checkpoint's training curve (metrics.jsonl) is not a trace either
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["run/a.jsonl", "run/b.jsonl", "run/deep/c.jsonl"]
    assert trace_files([tmp_path / "run" / "deep" / "metrics.jsonl"]) == [tmp_path / "run" / "deep" / "metrics.jsonl"]  # named: read
    assert trace_files([tmp_path / "run" / "notes.txt"]) == [tmp_path / "run" / "notes.txt"]
    with pytest.raises(UserError, match="no such trace file"):
        trace_files([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no \\*.jsonl"):
        trace_files([tmp_path / "empty"])


def test_a_log_named_on_the_command_line_is_skipped_like_one_in_a_folder(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "serve.log.jsonl").write_text('{"event": "run"}\n')
    assert trace_files([tmp_path / "a.jsonl", tmp_path / "serve.log.jsonl"]) == [tmp_path / "a.jsonl"]
    with pytest.raises(UserError, match=r"operational logs, \*.log.jsonl, are not traces"):
        trace_files([tmp_path / "serve.log.jsonl"])


def test_bad_lines_are_shown_as_text_or_by_size_never_as_raw_bytes():
    from negotiate.trace import shown

    assert shown(b'{"type": "message"\n') == '{"type": "message"'
    assert shown(b"x" * 100 + b"\n") == "x" * 60
    assert shown(b"\x1b]8;;http://evil\x07click\n") == "23 bytes of binary data"  # an escape sequence is not echoed
    assert shown("caf\u00e9 \u2713\n".encode()) == "caf\u00e9 \u2713"
    assert shown(b"\xff\xfe{\n") == "4 bytes of binary data"


def test_a_corrupt_middle_line_is_not_called_a_truncation(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in tiny("a")) + b"{corrupt\n"
                     + b"".join(orjson.dumps(e) + b"\n" for e in tiny("b")))
    with pytest.raises(UserError) as caught:
        list(read_episodes(path))
    assert str(caught.value) == f"{path}:4: line: '{{corrupt': not a JSON line"


def test_allow_partial_reports_each_part_it_drops(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, tiny("a") + tiny("b")[:2], orjson.dumps(tiny("b")[2])[:20])
    dropped: list[str] = []
    assert [e[0]["episode"] for e in read_episodes(path, allow_partial=True, on_skip=dropped.append)] == ["a"]
    assert dropped == [f"{path}:6: a cut-off last line of episode 'b'"]
    _write_lines(path, tiny("a")[:2] + tiny("b") + tiny("c")[:2])
    dropped.clear()
    assert [e[0]["episode"] for e in read_episodes(path, allow_partial=True, on_skip=dropped.append)] == ["b"]
    assert dropped == [f"{path}:1: episode 'a' has no episode_end", f"{path}:6: episode 'c' has no episode_end"]


# -- an episode id twice in one file: report and replay give the same line --------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real run's trace of 3 greedy episodes (ids greedy-000000..2, indices 0..2), as its lines."""
    from negotiate.cli import main

    out = tmp_path_factory.mktemp("served") / "run"
    assert main(["serve", "--episodes", "3", "--seller", "greedy", "--out", str(out), "--quiet"]) == 0
    lines = (out / "greedy.jsonl").read_bytes().splitlines(keepends=True)
    starts = [k for k, line in enumerate(lines) if line.startswith(b'{"type":"episode_start"')]
    return [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)])]


def _first_lines(episodes: list[list[bytes]]) -> list[int]:
    """The line number each episode starts on, counted from 1."""
    return [1 + sum(len(e) for e in episodes[:k]) for k in range(len(episodes))]


def _reindexed(episode: list[bytes], index: int) -> list[bytes]:
    start = orjson.loads(episode[0])
    return [orjson.dumps(start | {"index": index}) + b"\n", *episode[1:]]


@pytest.mark.parametrize("layout", ["adjacent", "apart", "apart, another index"])
def test_the_same_episode_id_twice_in_one_file_is_one_line_from_report_and_replay_alike(served, tmp_path, capsys, layout):
    from negotiate.cli import main

    e0, e1, e2 = served
    if layout == "adjacent":
        episodes = [e0, e0, e1]
    elif layout == "apart":
        episodes = [e0, e1, e2, e0]
    else:  # what report used to count twice: the copy claims index 7
        episodes = [e0, e1, _reindexed(e0, 7), e2]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(line for e in episodes for line in e))
    first, second = (_first_lines(episodes)[k] for k in ((0, 1) if layout == "adjacent" else (0, 3) if layout == "apart" else (0, 2)))
    expected = (f"{path}:{second}: episode: 'greedy-000000': the same episode id twice in one file "
                f"(lines {first} and {second}); keep one copy")
    for command in (["report", str(path)], ["replay", str(path), "--text"], ["replay", str(path), "--text", "--episode", "greedy-000001"]):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        assert captured.err == f"negotiate {command[0]}: error: {expected}\n" and captured.out == ""


def test_one_file_given_twice_and_one_index_twice_under_two_ids_are_told_apart(served, tmp_path, capsys):
    from negotiate.cli import main

    e0, e1, _ = served
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(e0 + e1))
    assert main(["report", str(path), str(path)]) == 2
    assert "appears twice (the file is given twice; pass each shard once)" in capsys.readouterr().err
    # The same index under another id, in one file: not "the file is given twice".
    renamed = [orjson.dumps(orjson.loads(e1[0]) | {"index": 0}) + b"\n", *e1[1:]]
    path.write_bytes(b"".join(e0 + renamed))
    assert main(["report", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{path}: episode: 'greedy-000001': episode index 0 of run {orjson.loads(e0[0])['run']} appears twice "
        "(in this file under another id)")


def test_unique_reading_costs_nothing_when_every_id_differs(served, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(line for e in served for line in e))
    assert [e[0]["episode"] for e in read_episodes(path, unique=True)] == ["greedy-000000", "greedy-000001", "greedy-000002"]
    doubled = tmp_path / "d.jsonl"
    doubled.write_bytes(path.read_bytes() * 2)
    assert len(list(read_episodes(doubled))) == 6  # without unique (training's readers): read as written
