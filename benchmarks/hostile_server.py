"""Peak memory and time of a request to a hostile model server, with each of our HTTP clients (issues 44 and 51).

A raw-TCP server on 127.0.0.1 (this process) answers every request with one misbehaviour:

* ``gzip``: 4 MB of gzip that inflates to 4 GiB of zeros (a gzip bomb; the client never asked for gzip);
* ``big``: a valid completion of 50 MB;
* ``stream``: ``Content-Length: 100000000000`` and zeros streamed until the client hangs up;
* ``negative``: a chunked answer whose first chunk size is ``-6``;
* ``chunks``: 20 MB of body in chunks of 1 byte each (``1\r\nx\r\n``, 120 MB on the wire);
* ``continue``: ``HTTP/1.1 100 Continue`` heads for ``--seconds`` (60) seconds, then the connection closed;
* ``late``: a right answer, and the same answer again 50 ms later on the same connection; the 4 requests
  ask in turn (16 each, each its own word, 0.1 s apart) and the row counts the replies that carry
  another request's word;
* ``trickle``: a valid answer, one byte a second (not in the default cases: each request takes its
  whole timeout; after 3 in a row the backend takes the server for down).

The server runs in a process of its own, and for each case and client (``client=http``,
``client=aiohttp``, ``client=openai``) a child process (so that its peak RSS is the client's alone; Linux carries
``ru_maxrss`` across ``exec``, so the parent that starts both stays small) makes 4 requests at once, as 4 episodes would, through ``OpenAIBackend.complete``
with ``timeout=10&retries=1`` (``--timeout``) and the default cap (8 MiB), and prints how each ended, the seconds until
the last one did, and its peak RSS (``resource.getrusage``), and the RSS after its imports for
comparison. With ``--via serve`` the child runs ``negotiate serve --seller
'openai:m@URL?client=C&retries=1&timeout=10' --episodes 4`` (``--timeout``) instead (the server answers ``GET /models``
honestly, so the run starts), and the row gives that command's peak RSS (``RUSAGE_CHILDREN``), its
seconds and exit status, and the failure reasons its trace records.

    python benchmarks/hostile_server.py                     # the table for benchmarks/README.md
    python benchmarks/hostile_server.py --via serve         # the same, as whole runs of 4 episodes
    python benchmarks/hostile_server.py --cases gzip --clients http
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

CASES = ("gzip", "big", "stream", "negative", "chunks", "continue", "late")
CLIENTS = ("http", "aiohttp", "openai")
BOMB = Path(os.environ.get("TMPDIR", "/tmp")) / "negotiate-gzip-bomb-4g.gz"


def bomb() -> bytes:
    """4 GiB of zeros as gzip (about 4 MB), made once and kept in a file."""
    if not BOMB.exists():
        packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        block = bytes(2**20)
        parts = [packer.compress(block) for _ in range(4096)]
        parts.append(packer.flush())
        BOMB.write_bytes(b"".join(parts))
    return BOMB.read_bytes()


def completion(content: str) -> bytes:
    return json.dumps({"id": "c", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                             "finish_reason": "stop"}]}).encode()


async def serve(case: str, seconds: float) -> None:
    """The server side: answers with ``case`` until killed; prints its port."""
    packed = bomb() if case == "gzip" else b""
    big = completion("x" * 50_000_000) if case == "big" else b""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(length[1]) if length else 0)
                if head.startswith(b"GET"):  # the check before a run: a model list, the one honest answer
                    models = json.dumps({"data": [{"id": "m", "owned_by": "vllm"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(models) + models)
                elif case == "gzip":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(packed) + packed)
                elif case == "big":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
                elif case == "stream":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n")
                    block = bytes(2**20)
                    for _ in range(100_000):  # 100 GB, or until the client hangs up
                        writer.write(block)
                        await writer.drain()
                elif case == "chunks":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                    block = b"1\r\nx\r\n" * 10_000
                    for _ in range(2_000):  # 20 MB of body, or until the client hangs up
                        writer.write(block)
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                elif case == "continue":
                    block = b"HTTP/1.1 100 Continue\r\n\r\n" * 1_000
                    end = time.monotonic() + seconds
                    while time.monotonic() < end:
                        writer.write(block)
                        await writer.drain()
                    break
                elif case == "late":
                    word = json.loads(body)["messages"][-1]["content"]
                    answer = completion(word)
                    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer
                    writer.write(answer)
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    writer.write(answer)
                elif case == "trickle":
                    answer = completion("slow")
                    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer
                    for at in range(len(answer)):
                        writer.write(answer[at:at + 1])
                        await writer.drain()
                        await asyncio.sleep(1.0)
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nhello!\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


def child(url: str, client: str, timeout: float) -> None:
    """The client side: 4 requests at once (16 in turn each for ``late``); prints one JSON line."""
    from negotiate.agents.contract import LLMError, LLMTimeout
    from negotiate.agents.openai_server import OpenAIBackend, OpenAIOptions
    from negotiate.agents.pools import Pools

    imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    late = url.endswith("#late")
    url = url.removesuffix("#late")

    async def main() -> list[str]:
        pools = Pools()  # the run's: the 4 requests share its clients, closed at the end
        backend = OpenAIBackend(OpenAIOptions(model="m", base_url=url, client=client, timeout=timeout, retries=1), pools=pools)

        async def one(k: int) -> str:
            try:
                reply = await backend.complete([{"role": "user", "content": "hi"}], role="seller")
                return f"answered ({len(reply.text)} characters kept)"
            except (LLMError, LLMTimeout) as error:
                return f"{type(error).__name__}: {str(error).split(': ', 1)[1]}"

        async def words(k: int) -> str:
            wrong = 0
            for n in range(16):
                word = f"request-{k}-{n}"
                try:
                    reply = await backend.complete([{"role": "user", "content": word}], role="seller")
                except (LLMError, LLMTimeout) as error:
                    return f"{type(error).__name__}: {str(error).split(': ', 1)[1]}"
                wrong += reply.text != word
                await asyncio.sleep(0.1)
            return f"{wrong} of 16 replies carried another request's answer"

        try:
            return list(await asyncio.gather(*((words if late else one)(k) for k in range(4))))
        finally:
            await pools.aclose()

    began = time.perf_counter()
    outcomes = asyncio.run(main())
    print(json.dumps({"seconds": round(time.perf_counter() - began, 2), "imports_mb": round(imports),
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "outcomes": sorted(set(outcomes))}))


def child_serve(url: str, client: str, timeout: float) -> None:
    """``negotiate serve`` against the server, 4 episodes; prints one JSON line."""
    import tempfile

    spec = f"openai:m@{url}?client={client}&retries=1&timeout={timeout:g}"
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "negotiate", "serve", "--seller", spec, "--episodes", "4", "--out", out,
                               "--quiet"], capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - began
        reasons = set()
        for trace in Path(out).glob("openai-*.jsonl"):
            for line in trace.read_text().splitlines():
                event = json.loads(line)
                if event.get("type") == "episode_end":
                    reasons.add(f"{event.get('outcome')}: {str(event.get('reason')).split(': ', 2)[-1]}")
    print(json.dumps({"seconds": round(seconds, 2), "imports_mb": None, "exit": done.returncode,
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
                      "outcomes": sorted(reasons)}))


def measure(cases, clients, via: str, timeout: float, seconds: float) -> list[dict]:
    rows = []
    for case in cases:
        server = subprocess.Popen([sys.executable, __file__, "--serve", case, "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
            if case == "late" and via == "requests":
                url += "#late"  # the child asks in turn, a word each (the fragment never reaches the server)
            for client in clients:
                out = subprocess.run([sys.executable, __file__, "--child", url, client, via, str(timeout)], capture_output=True,
                                     text=True, cwd=Path(__file__).parent.parent, timeout=600, check=True).stdout
                rows.append({"case": case, "client": client, **json.loads(out.strip().splitlines()[-1])})
                print(rows[-1], file=sys.stderr)
        finally:
            server.kill()
            server.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--via", choices=("requests", "serve"), default="requests",
                        help="4 requests at once through the backend, or negotiate serve with 4 episodes")
    parser.add_argument("--timeout", type=float, default=10.0, help="the spec's timeout= (seconds; retries=1)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the continue case sends 100 Continue heads")
    parser.add_argument("--child", nargs=4, metavar=("URL", "CLIENT", "VIA", "TIMEOUT"), help=argparse.SUPPRESS)
    parser.add_argument("--serve", choices=(*CASES, "trickle"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, client, via, timeout = args.child
        (child_serve if via == "serve" else child)(url, client, float(timeout))
        return
    if args.serve:
        asyncio.run(serve(args.serve, args.seconds))
        return
    rows = measure(args.cases.split(","), args.clients.split(","), args.via, args.timeout, args.seconds)
    if args.via == "serve":
        print("| case | client | seconds | peak RSS (MB) | exit | how the 4 episodes ended |")
    else:
        print("| case | client | seconds | peak RSS (MB) | after imports (MB) | how the 4 requests ended |")
    print("|---|---|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['case']} | {row['client']} | {row['seconds']} | {row['peak_mb']} | "
              f"{row['exit'] if args.via == 'serve' else row['imports_mb']} | {'; '.join(row['outcomes'])} |")


if __name__ == "__main__":
    main()
