"""Save SVG screenshots of the main screens: ``python -m negotiate.tui.screenshots [FOLDER]`` (default ``docs``).

Each screen is driven headless with Textual's Pilot on a fixed market (seed 3 of
the train split) with scripted agents and no pacing, so the pictures are the
same from run to run.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from negotiate.agents.registry import parse_agent
from negotiate.market import SPLITS
from negotiate.run import Run, RunConfig

from negotiate.tui.app import NegotiateApp
from negotiate.tui.session import PlaySession
from negotiate.tui.transcript import Recorded

SIZE = (100, 30)
SEED = 3


async def _wait(pilot, condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError("the app did not get there")
        await pilot.pause(0.02)


async def _turn(pilot, session: PlaySession) -> None:
    app = pilot.app
    # The turn's cursor is placed (on the composer's first field, the price) one refresh after the turn starts.
    await _wait(pilot, lambda: session.result is not None or (session.human.waiting and not app.screen.focus_pending
                                                             and app.focused is not None))


async def buyer(folder: Path, traces: Path) -> Path:
    session = PlaySession("buyer", SPLITS["train"], SEED, seller=parse_agent("greedy", "seller"),
                          buyers=parse_agent("concession", "buyer"), out=traces, pace=0, others_pace=0)
    app = NegotiateApp.play(session)
    async with app.run_test(size=SIZE) as pilot:
        await _turn(pilot, session)
        # A reply being written (not sent yet): a counter-offer on the product offered.
        await pilot.press("ctrl+o", "2", "5", "0", "tab")
        app.screen.query_one("#talk").value = "That is far more than the Ultra is worth to me. $250?"
        await pilot.pause(0.2)
        return Path(app.save_screenshot(path=str(folder), filename="play-buyer.svg"))


async def seller(folder: Path, traces: Path) -> list[Path]:
    session = PlaySession("seller", SPLITS["train"], SEED, buyers=parse_agent("concession", "buyer"), out=traces, pace=0, others_pace=0)
    app = NegotiateApp.play(session)
    shots = []
    async with app.run_test(size=SIZE) as pilot:
        for price, talk in (("780", "Our Plus sofa, nearly new."), ("600", "The Ultra, a steal."), ("700", "Plus or Ultra, your pick.")):
            await _turn(pilot, session)
            await pilot.press("ctrl+o", *price, "tab")
            app.screen.query_one("#talk").value = talk
            await pilot.press("enter")
        await _turn(pilot, session)
        await pilot.press("ctrl+p", "ctrl+p")  # back to b2, to read its reply
        await pilot.pause(0.3)
        shots.append(Path(app.save_screenshot(path=str(folder), filename="play-seller.svg")))
        await pilot.press("ctrl+t", "y")  # end the market, confirmed
        await app.workers.wait_for_complete()
        await pilot.pause(0.3)
        shots.append(Path(app.save_screenshot(path=str(folder), filename="play-seller-results.svg")))
    return shots


async def replay_episode():
    """The replayed episode: index SEED of ``negotiate serve --seller greedy --buyers concession`` (run seed 0)."""
    async with Run(RunConfig(sellers=("greedy",), buyers="concession")) as run:
        return await run.episode(parse_agent("greedy", "seller"), SEED).play()


async def replay(folder: Path) -> Path:
    recorded = Recorded((await replay_episode()).events)
    app = NegotiateApp.replay([recorded], "traces/example/greedy.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*["right"] * max(1, len(recorded.steps) * 2 // 3))
        await pilot.pause(0.3)
        return Path(app.save_screenshot(path=str(folder), filename="replay.svg"))


async def main(folder: Path) -> list[Path]:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # the results screen names the trace file: show the default, traces/play
        try:
            return [await buyer(folder, Path("traces") / "play"), *await seller(folder, Path("traces") / "play"), await replay(folder)]
        finally:
            os.chdir(here)


if __name__ == "__main__":
    for path in asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))):
        print(path)
