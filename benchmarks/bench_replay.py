"""Time per key in the replay viewer when every reply is 100 KB: the cut fields (the viewer's default) against whole.

A trace of one recorded greedy episode (train split, concession buyers) whose every message carries a 100 KB
thought and a 100 KB talk, and whose seller messages are invalid with a 100 KB raw reply (a model that wrote a
novel). Textual's pilot presses → until the whole episode shows, then ← back to the start; each press is timed
from the key to the screen having redrawn (``pilot.press`` then ``pilot.pause``), as a person would wait for it.
It runs with ``ReplayScreen.field_limit`` at its default (1000 characters), at 4000 (``replay --text``'s cut) and at
None (every field drawn whole, as before the cut), beside 1 KB fields (the viewer's own cost), and prints the median
and worst key of each.

    python benchmarks/bench_replay.py                 # 100 KB fields
    python benchmarks/bench_replay.py --kb 10 --steps 6
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import SPLITS
from negotiate.runner import build_episode
from negotiate.trace import TraceWriter
from negotiate.tui.app import NegotiateApp
from negotiate.tui.replay import ReplayScreen
from negotiate.tui.transcript import load_trace


def write_trace(path: Path, kb: int) -> None:
    market, seller, buyers = build_episode(SPLITS["train"], parse_agent("greedy", "seller"), parse_agent("concession", "buyer"), 0, 0)
    events = anyio.run(lambda: run_episode(market, seller, buyers, episode_id="big-000000")).events
    words = ("lorem ipsum dolor sit amet " * (kb * 1024 // 27 + 1))[: kb * 1024]
    for event in events:
        if event["type"] == "message":
            event["thought"], event["talk"] = words, words
            if event["sender"] == "seller":
                event["raw"] = words
                event["action"], event["valid"], event["error"] = None, False, "not valid JSON"
    with TraceWriter(path) as writer:
        writer.write(events)


async def keys(path: Path, limit: int | None, steps: int) -> list[float]:
    ReplayScreen.field_limit = limit
    app = NegotiateApp.replay(load_trace(path), str(path))
    times = []
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        total = min(steps, len(app.screen.episode.steps))
        for key in ["right"] * total + ["left"] * total:
            began = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", type=int, default=100, help="size of each long field, in KB")
    parser.add_argument("--steps", type=int, default=12, help="steps forward (then back) to time")
    args = parser.parse_args()
    default = ReplayScreen.field_limit
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.jsonl"
        small = Path(folder) / "small.jsonl"
        write_trace(path, args.kb)
        write_trace(small, 1)
        for label, trace, limit in (("1 KB fields", small, default), (f"{args.kb} KB, cut at {default}", path, default),
                                    (f"{args.kb} KB, cut at 4000", path, 4000), (f"{args.kb} KB, whole", path, None)):
            times = anyio.run(keys, trace, limit, args.steps)
            print(f"{label:>22}: {len(times)} keys, median {statistics.median(times) * 1000:.0f} ms, "
                  f"worst {max(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
