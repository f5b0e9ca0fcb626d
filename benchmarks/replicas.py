"""Throughput of 1 vs 2 model replicas behind one spec (``openai:MODEL@URL|URL``), and of 2 with one killed or hung mid-run.

Each replica is a stand-in server in its own process (``--serve``): it answers every chat request with
``tests/fake_openai.py``'s ``scripted_reply`` after ``--latency`` seconds (default 0.2), and works on at most
``--slots`` requests at once (default 8; the rest wait inside it, as requests wait for a GPU's batch), so one
replica's ceiling is ``slots / latency`` requests per second (40 by default) whatever the client sends it.

For each row, ``negotiate serve`` (in this process, as the command line runs it) plays ``--episodes`` episodes
(default 200) with the model as seller and threshold buyers, ``--concurrency`` (default 64) in flight, and the
benchmark reports wall time, episodes and requests per second, the share each replica answered, and the
failed episodes (none expected: in the third row one replica is SIGKILLed once half of the two-replica
run's time has passed, and its requests go to the other). ``--hang`` adds a fourth row: one replica SIGSTOPped
(a hung server: its connections stay open and nothing answers) at that time, and SIGCONTed once the run ends;
``--timeout S`` is the spec's request timeout (default 30; the spec's own default is 60), which is how long a
hung replica's requests wait.

    python benchmarks/replicas.py                         # 1 replica, 2 replicas, 2 with one killed
    python benchmarks/replicas.py --latency 0.05 --slots 32 --episodes 400
    python benchmarks/replicas.py --hang --only-faults --timeout 60 --episodes 400   # 1 replica, 2 with one hung
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def serve(latency: float, slots: int) -> None:
    """A stand-in server: ``slots`` requests worked on at once, each answered after ``latency`` s; prints its port.
    ``GET /stats`` gives the requests answered."""
    import asyncio

    import orjson
    from aiohttp import web

    sys.path.insert(0, str(TESTS))
    from fake_openai import scripted_reply

    answered = 0

    async def chat(request: web.Request) -> web.Response:
        nonlocal answered
        body = await request.json()
        async with slots_held:
            await asyncio.sleep(latency)
        content = scripted_reply(body)
        answered += 1
        return web.Response(content_type="application/json", body=orjson.dumps({
            "id": f"b-{answered}", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130}}))

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "vllm"}]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"answered": answered})

    async def main() -> None:
        nonlocal slots_held
        slots_held = asyncio.Semaphore(slots)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    slots_held = None
    asyncio.run(main())


class Replica:
    """One stand-in server process."""

    def __init__(self, latency: float, slots: int):
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", str(latency), "--slots", str(slots)],
                                        stdout=subprocess.PIPE, text=True)
        self.port = int(self.process.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.answered = 0

    def read(self) -> None:
        """Its count of answered requests (kept from the last read once it is dead)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as response:
                self.answered = json.loads(response.read())["answered"]
        except OSError:
            pass

    def kill(self) -> None:
        self.read()
        os.kill(self.process.pid, signal.SIGKILL)

    def hang(self) -> None:
        self.read()
        self.hung = True
        os.kill(self.process.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.process.poll() is None:
            if getattr(self, "hung", False):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
        self.process.wait(10)


def run(args, count: int, kill_at: float | None, hang: bool = False) -> dict:
    """One row: ``count`` replicas; the first killed (``hang``: stopped) ``kill_at`` seconds in (None: none)."""
    from negotiate.cli import main

    replicas = [Replica(args.latency, args.slots) for _ in range(count)]
    killer = None
    try:
        spec = f"openai:bench@{'|'.join(r.url for r in replicas)}?format=tagged&max_tokens=64&retries=1&timeout={args.timeout:g}"
        if kill_at is not None:
            killer = threading.Timer(kill_at, replicas[0].hang if hang else replicas[0].kill)
            killer.start()
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # serve's own table: the rows below say it
                code = main(["serve", "--seller", spec, "--episodes", str(args.episodes), "--concurrency", str(args.concurrency),
                             "--out", f"{folder}/r", "--quiet"])
            wall = time.perf_counter() - began
            ends = [json.loads(line) for path in Path(folder, "r").glob("*.jsonl") if not path.name.endswith(".log.jsonl")
                    for line in path.read_bytes().splitlines()]
            ends = [event for event in ends if event["type"] == "episode_end"]
        for replica in replicas:
            if replica.process.poll() is None:
                replica.read()
    finally:
        if killer is not None:
            killer.cancel()
        for replica in replicas:
            replica.stop()
    requests = sum(r.answered for r in replicas)
    return {"replicas": count, "killed_at_s": kill_at, "fault": ("hung" if hang else "killed") if kill_at is not None else "-",
            "exit": code, "episodes": len(ends),
            "unique": len({e["episode"] for e in ends}), "failed": sum(e["outcome"] == "failed" for e in ends),
            "wall_s": round(wall, 2), "episodes_per_s": round(len(ends) / wall, 1), "requests_per_s": round(requests / wall, 1),
            "answered": [r.answered for r in replicas], "ceiling_per_s": round(count * args.slots / args.latency, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per answer (default 0.2)")
    parser.add_argument("--slots", type=int, default=8, help="requests a replica works on at once (default 8)")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per row (default 200)")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes in flight (default 64)")
    parser.add_argument("--timeout", type=float, default=30.0, help="the spec's request timeout in seconds (default 30)")
    parser.add_argument("--hang", action="store_true", help="add a row with one of two replicas SIGSTOPped mid-run")
    parser.add_argument("--only-faults", action="store_true", help="only the one-replica row and the fault rows")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.latency, args.slots)
        return 0
    rows = [run(args, 1, None)]
    half = rows[0]["wall_s"] / 4  # half of what two replicas take
    if not args.only_faults:
        rows.append(run(args, 2, None))
        half = rows[1]["wall_s"] / 2
        rows.append(run(args, 2, half))
    if args.hang:
        rows.append(run(args, 2, half, hang=True))
    print(f"{'replicas':>8} {'fault':>6} {'at':>6} {'episodes':>8} {'failed':>6} {'wall s':>7} {'ep/s':>6} {'req/s':>6} {'ceiling':>7}  answered")
    for row in rows:
        at = f"{row['killed_at_s']:.1f}s" if row["killed_at_s"] is not None else "-"
        print(f"{row['replicas']:>8} {row['fault']:>6} {at:>6} {row['episodes']:>8} {row['failed']:>6} {row['wall_s']:>7} "
              f"{row['episodes_per_s']:>6} {row['requests_per_s']:>6} {row['ceiling_per_s']:>7}  {row['answered']}")
    print(f"(latency {args.latency} s, {args.slots} slots per replica, timeout {args.timeout:g} s, {args.episodes} episodes, "
          f"concurrency {args.concurrency}, {os.cpu_count()} CPUs)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(row["failed"] == 0 and row["unique"] == row["episodes"] == args.episodes for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
