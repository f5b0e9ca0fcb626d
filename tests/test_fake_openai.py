"""The fake OpenAI server's own count of requests in flight, which the in-flight bound's tests rest on."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import Fault, serve_in_thread  # noqa: E402

BODY = orjson.dumps({"model": "fake-model", "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]})
POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY), BODY)


def test_a_request_its_client_gave_up_on_is_no_longer_in_flight():
    """A client with a bound of 1 gives up on a request (closes its connection) and sends the next on a kept-alive
    connection while the server's thread is not running (a busy machine): the server then sees the close and the
    next request at once, before the first one's handler is cancelled. One request is in flight, not two."""
    arrived = [threading.Event(), threading.Event()]
    stalled, release = threading.Event(), threading.Event()
    with serve_in_thread(reply=lambda body: "an answer") as server:
        server.faults.append(Fault(delay=60))  # the first request is not answered: its client gives up
        server.on_request = lambda body: arrived[len(server.requests) - 1].set()
        with socket.create_connection(("127.0.0.1", server.port)) as kept, socket.create_connection(("127.0.0.1", server.port)) as first:
            first.sendall(POST)
            assert arrived[0].wait(30)

            def stall() -> None:  # the server's thread, descheduled
                stalled.set()
                release.wait(30)

            server.loop.call_soon_threadsafe(stall)
            assert stalled.wait(30)
            first.close()  # given up on
            kept.sendall(POST)  # the next request, on the other connection
            release.set()
            assert arrived[1].wait(30)
            assert server.max_in_flight == 1
            kept.settimeout(30)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200 OK") and len(server.requests) == 2
