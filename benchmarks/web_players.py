"""How many people one core serves with ``negotiate play --web``: N headless Chromium pages on one server.

    python benchmarks/web_players.py                       # 8 players, the train split, greedy seller, concession buyers
    python benchmarks/web_players.py --players 16 --idle 30

The server runs as ``negotiate play --web`` would for a study (default pacing: the seller answers after 0.5 s, the
other buyers after 4 s). The pages are driven as in ``tests/test_web.py``: each bids a third of its value at its
first turn, then accepts an offer it can afford and rejects the rest, as fast as the screen allows (a person is far
slower). Measured from ``/proc`` over the server and every process under it (each visitor's ``sh`` and
``python -m negotiate play``), so the browser's own cost is left out:

* **start**: wall seconds from the N pages opening until each shows its first turn;
* **idle**: CPU (% of one core) and memory per player while all N wait on the person's move for ``--idle`` seconds
  (the cursor blinks; paced buyers keep bargaining on the train split);
* **playing**: CPU seconds per person's move, and per episode, while all N play to the end.

Players per core = 100 / (idle % + moves per second x CPU per move x 100); the table gives it for a person who moves
every 10 s. Linux only (``/proc``); needs textual-serve, Playwright and ``/usr/bin/chromium``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_web import CHROMIUM, TURN, Server, Visitor, play  # noqa: E402  (the browser tests' driver)

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB: PSS counts pages shared with other processes (the interpreter, libraries) by share."""
    rollup = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value, *_ = line.split()
            rollup[key.rstrip(":")] = int(value) / 1024
    except OSError:
        return 0.0, 0.0
    return rollup.get("Rss", 0.0), rollup.get("Pss", 0.0)


def players(server: Server) -> list[int]:
    """The visitors' ``negotiate play`` processes."""
    found = []
    for pid in tree(server.process.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"play" in cmdline and b"--index" in cmdline:
            found.append(pid)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=8, help="pages playing at once (default 8)")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds to measure all of them idle (default 20)")
    parser.add_argument("--split", default="train", help="the market the server offers (default train)")
    parser.add_argument("--buyers", default="concession", help="the other buyers (default concession)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        server = Server(Path(tmp), "--split", args.split, "--buyers", args.buyers, "--max-players", str(args.players))
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            before = cpu_seconds(tree(server.process.pid))
            started = time.monotonic()
            visitors = [Visitor(browser, server.url) for _ in range(args.players)]
            while not all(TURN.search(v.screen()) for v in visitors):
                assert time.monotonic() - started < 300, "the players were not all seated in 5 minutes"
                visitors[0].page.wait_for_timeout(100)
            start_s = time.monotonic() - started
            start_cpu = cpu_seconds(tree(server.process.pid)) - before
            pids = players(server)
            idle_from = cpu_seconds(tree(server.process.pid))
            visitors[0].page.wait_for_timeout(args.idle * 1000)
            idle_cpu = cpu_seconds(tree(server.process.pid)) - idle_from
            memory = [memory_mb(pid) for pid in pids]
            server_memory = memory_mb(server.process.pid)
            play_from, play_started = cpu_seconds(tree(server.process.pid)), time.monotonic()
            play(visitors, timeout=600, max_moves=100)
            play_s = time.monotonic() - play_started
            play_cpu = cpu_seconds(tree(server.process.pid)) - play_from
        finally:
            browser.close()
            code = server.stop()
    moves = sum(len(v.moves) for v in visitors)
    n = args.players
    idle_pct = 100 * idle_cpu / args.idle / n
    per_move = play_cpu / moves
    per_core = 100 / (idle_pct + 100 * per_move / 10)
    rss = sum(m[0] for m in memory) / len(memory)
    pss = sum(m[1] for m in memory) / len(memory)
    print(f"{n} players, split {args.split}, buyers {args.buyers}; {os.cpu_count()} cores (shared with whatever else runs)")
    print(f"start:   {start_s:.1f} s until all {n} show their first turn; {start_cpu:.1f} CPU s, {start_cpu / n:.2f} per player")
    print(f"idle:    {idle_pct:.1f}% of a core per player over {args.idle:.0f} s")
    print(f"memory:  {rss:.0f} MB RSS, {pss:.0f} MB PSS per player process; the server {server_memory[0]:.0f} MB RSS")
    print(f"playing: {moves} moves in {play_s:.1f} s, {play_cpu:.1f} CPU s: {per_move:.3f} CPU s per move, "
          f"{play_cpu / n:.2f} per episode")
    print(f"players per core, a move every 10 s: {per_core:.0f} (idle {idle_pct:.1f}% + {10 * per_move:.1f}% for moves)")
    print(f"server exit code {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
