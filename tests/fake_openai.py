"""A small OpenAI-compatible server on 127.0.0.1 for the LLM agent tests.

``POST /v1/chat/completions`` and ``GET /v1/models``, on a random free port, in the
test's own event loop. By default it answers with :func:`scripted_reply`, a
strategy that reads our prompt (seller or buyer, JSON or tagged) and answers in
that format; a test may pass its own ``reply`` function. Faults are queued per
request (:class:`Fault`: an HTTP status, a fixed content, a finish reason, a delay or
a hang), and every request is recorded, so tests can assert on what the client sent
(structured-output fields, log-probs, ``return_token_ids``). It counts the requests in flight (``in_flight``,
``max_in_flight``) as a client's bound does, and can hold the first ones until a bound is reached
(``hold``), so that a test sees the bound reached whatever the machine's load.

    async with FakeOpenAI() as server:
        server.faults.append(Fault(status=429))
        ... spec = f"openai:{server.model}@{server.url}?retries=1"
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson
from aiohttp import web

__all__ = ["FakeOpenAI", "Fault", "Reply", "scripted_reply", "free_port"]


@dataclass
class Reply:
    content: str
    finish_reason: str = "stop"


@dataclass
class Fault:
    """What the server does instead of (or before) answering one request."""

    status: int = 200
    """An HTTP error status (429, 500, 400, ...) with an OpenAI-style error body; 200 answers."""
    message: str = ""
    """The error message (or nothing: a default per status)."""
    content: str | None = None
    """With status 200: this content instead of the reply function's."""
    finish_reason: str | None = None
    delay: float = 0.0
    """Seconds to wait first; a hang is a delay longer than the client's timeout (it ends when the server closes)."""
    headers: dict = field(default_factory=dict)


def free_port() -> int:
    """A port nothing listens on (bound, then released): a server that is down."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the scripted strategy -------------------------------------------------------------------

_SELLER_PRODUCT = re.compile(r"^- (p\d+) .*?: cost \$(\d+), (.+)$", re.M)
_BUYER_PRODUCT = re.compile(r"^- (p\d+) .*?: worth \$(\d+) to you, (.+)$", re.M)
_SELLER_BUYER = re.compile(r"^- (b\d+): .*?Your standing offer: (?:(p\d+) \$(\d+)|none)\. Its standing bid: (?:(p\d+) \$(\d+)|none)\.", re.M)
_FREE = re.compile(r"Write your next message to one of: (.+)\.")
_OFFER = re.compile(r"The seller's standing offer to you: (?:(p\d+) \$(\d+)|none)\.")


def _render(fmt: str, thought: str, to: str, talk: str, kind: str, product: str | None = None, price: int | None = None) -> str:
    if fmt == "json":
        return orjson.dumps({"thought": thought, "to": to, "talk": talk, "action": {"kind": kind, "product": product, "price": price}}).decode()
    action = f"[{kind.upper()}] {product} ${price}" if product else f"[{kind.upper()}]"
    return f"Thought: {thought}\nTo: {to}\nTalk: {talk}\nAction: {action}"


def scripted_reply(body: dict) -> str:
    """A plausible seller or buyer reply, read off our own prompt; in the format the prompt asks for."""
    messages = body["messages"]
    system, user = messages[0]["content"], messages[1]["content"]
    fmt = "json" if "Reply with one JSON object" in system else "tagged"
    if system.startswith("You are the seller"):
        stock = {p: int(c) for p, c, s in _SELLER_PRODUCT.findall(user) if s != "sold out"}
        free = _FREE.search(user)
        to = free.group(1).split(", ")[0] if free else ""
        if not stock or not to.startswith("b"):
            return _render(fmt, "Nothing left to do.", "", "That is all.", "end")
        product = next(iter(stock))
        for block in re.split(r"\n(?=- b\d+: )", user):
            found = _SELLER_BUYER.match(block.strip())
            if not found or found.group(1) != to:
                continue
            bid_p, bid_price = found.group(4), found.group(5)
            if bid_p and bid_p in stock and int(bid_price) >= stock[bid_p]:
                return _render(fmt, "A fair bid.", to, "Deal.", "accept", bid_p, int(bid_price))
            tries = block.count("you: [OFFER]")
            price = max(stock[product], stock[product] + 400 - 150 * tries)
            return _render(fmt, "Come down a little." if tries else "Start high.", to, f"For you, ${price}.", "offer", product, price)
        return _render(fmt, "Start high.", to, f"The {product} is yours.", "offer", product, stock[product] + 400)
    values = {p: int(v) for p, v, s in _BUYER_PRODUCT.findall(user)}
    offer = _OFFER.search(user)
    if offer and offer.group(1):
        product, price = offer.group(1), int(offer.group(2))
        if price <= values.get(product, -1):
            return _render(fmt, "Worth it.", "seller", "I'll take it.", "accept", product, price)
        return _render(fmt, "Too much.", "seller", "Too much for me.", "bid", product, int(values.get(product, 0) * 0.8))
    return _render(fmt, "Nothing on the table.", "seller", "No, thanks.", "reject")


# -- the server -------------------------------------------------------------------------------


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    kinds = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError"}
    body = {"error": {"message": message, "type": kinds.get(status, "InternalServerError"), "param": None, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", headers=headers)


class FakeOpenAI:
    """An OpenAI-compatible server with scripted behaviour; use as ``async with FakeOpenAI() as server``."""

    def __init__(self, reply=scripted_reply, *, model: str = "fake-model", api_key: str | None = None, latency: float = 0.0,
                 owned_by: str | None = "fake", hold: int = 0):
        self.reply = reply
        """body -> str or Reply."""
        self.model = model
        self.owned_by = owned_by
        """``owned_by`` of the model in ``GET /v1/models`` (vLLM says ``vllm``, llama-cpp-python ``me``);
        None: the server has no models endpoint (404)."""
        self.api_key = api_key
        """If set, requests without ``Authorization: Bearer <api_key>`` get 401."""
        self.latency = latency
        """Seconds before every answer."""
        self.faults: deque[Fault] = deque()
        """Consumed one per request, before normal answers."""
        self.requests: list[dict] = []
        """Every chat request's JSON body, in arrival order (``_headers`` added)."""
        self.max_in_flight = 0
        """The most chat requests :attr:`in_flight` at once."""
        self.hold = hold
        """Hold the first chat requests (answer none) until this many are in flight at once, then answer as usual:
        a test of a bound of N asks N and sees exactly N, however slow the machine. A minute is the hang guard."""
        self.on_request = None
        """Called with each chat request's body as it arrives (on the server's thread), after it is counted."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The server's event loop (set once it runs)."""
        self._handling: dict[int, web.Request] = {}
        self._held = asyncio.Event()
        if hold <= 0:
            self._held.set()
        self.model_lists = 0
        """``GET /v1/models`` requests seen."""
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FakeOpenAI:
        self.loop = asyncio.get_running_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    @property
    def in_flight(self) -> int:
        """The chat requests being answered whose client still waits: a request whose connection the client has
        closed (it gave up: a timeout, a market that closed) no longer counts, as it no longer counts in the
        client's bound, though its handler may not have been cancelled yet (a busy machine runs this thread
        late, and sees the close and the next request at once)."""
        return sum(1 for request in self._handling.values() if request.transport is not None and not request.transport.is_closing())

    async def __aexit__(self, *exc) -> None:
        self._closing.set()
        await self._runner.cleanup()

    async def _wait_for(self, event: asyncio.Event, seconds: float) -> None:
        """Until ``event`` is set, the server closes, or ``seconds`` pass."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._closing.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _wait(self, seconds: float) -> None:
        if seconds > 0:
            try:
                await asyncio.wait_for(self._closing.wait(), seconds)
            except TimeoutError:
                pass

    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def _models(self, request: web.Request) -> web.Response:
        self.model_lists += 1
        if not self._authorized(request):
            return _error(401, "Incorrect API key provided.")
        if self.owned_by is None:
            return _error(404, "Not Found")
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": self.owned_by}]})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["_headers"] = dict(request.headers)
        self.requests.append(body)
        self._handling[id(request)] = request
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.on_request is not None:
            self.on_request(body)
        try:
            if not self._held.is_set():
                if self.in_flight >= self.hold:
                    self._held.set()
                else:
                    await self._wait_for(self._held, 60.0)
            fault = self.faults.popleft() if self.faults else Fault()
            await self._wait(fault.delay or self.latency)
            if not self._authorized(request):
                return _error(401, "Incorrect API key provided.")
            if body.get("model") != self.model:
                return _error(404, f"The model `{body.get('model')}` does not exist.")
            if fault.status != 200:
                default = {429: "Rate limit reached.", 400: "Bad request."}.get(fault.status, "Internal server error.")
                return _error(fault.status, fault.message or default, fault.headers)
            answer = self.reply(body) if fault.content is None else fault.content
            if isinstance(answer, str):
                answer = Reply(answer)
            return web.Response(body=orjson.dumps(self._completion(body, answer, fault)), content_type="application/json")
        finally:
            del self._handling[id(request)]

    def _completion(self, body: dict, answer: Reply, fault: Fault) -> dict:
        words = answer.content.split(" ")
        prompt_words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        choice: dict = {"index": 0, "message": {"role": "assistant", "content": answer.content},
                        "finish_reason": fault.finish_reason or answer.finish_reason}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": w, "logprob": -0.25, "bytes": list(w.encode()), "top_logprobs": []} for w in words]}
        out = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()), "model": self.model,
               "choices": [choice],
               "usage": {"prompt_tokens": prompt_words, "completion_tokens": len(words), "total_tokens": prompt_words + len(words)}}
        if body.get("return_token_ids"):
            choice["token_ids"] = [1000 + k for k in range(len(words))]
            out["prompt_token_ids"] = list(range(prompt_words))
        return out


@contextmanager
def serve_in_thread(**kwargs):
    """A :class:`FakeOpenAI` on its own thread and event loop, for code that blocks (the CLI, worker processes)."""
    ready, box = threading.Event(), {}

    def run() -> None:
        async def main() -> None:
            box["stop"] = asyncio.Event()
            async with FakeOpenAI(**kwargs) as server:
                box["server"] = server
                ready.set()
                await box["stop"].wait()

        loop = box["loop"] = asyncio.new_event_loop()
        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "the fake server did not start"
    try:
        yield box["server"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
