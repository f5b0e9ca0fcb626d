"""The ``openai:`` backend: a model behind an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, OpenAI).

:class:`OpenAIBackend` turns chat messages into a :class:`~negotiate.agents.contract.Completion` (the text, finish
reason, token ids, log-probs, usage, latency) with ``await backend.complete(messages, role=...)``, over HTTP: our own
HTTP/1.1 client, aiohttp, or the ``openai`` client (:mod:`negotiate.agents.clients` shares them per server and key).
Its spec, ``openai:MODEL@BASE_URL[|BASE_URL...][?KEY=VALUE...]``, and every key it takes are described once, in
``negotiate.agents.registry.GRAMMAR``; :func:`parse_openai_spec` reads it into :class:`OpenAIOptions`. How a request
is shaped for each kind of server (``server=``) is the table :data:`SERVER_KINDS`.

The API key is read from the environment, never from the spec: specs are written into
traces. One HTTP client is shared per (base URL, key) and event loop in a run's pools
(``negotiate.agents.pools``: the run owns and closes them, and its request log), with an
in-flight bound (a FIFO limiter) on the requests so a vLLM server can batch them without
being flooded. The default client (``client=http``, :mod:`negotiate.agents.http1`) keeps
its own keep-alive connections and writes each request as one prebuilt buffer; with
``client=aiohttp`` the same requests go through one shared ``aiohttp.ClientSession``; with
``client=openai``, through ``AsyncOpenAI`` over its aiohttp transport, on that same session (its
own retries off). All three do our retries (exponential backoff with jitter, Retry-After honored),
deadline and error classification, in one loop (:meth:`OpenAIBackend._post`), so they return the
same :class:`Completion` and raise the same errors. Their HTTP work costs about 45 us and 180 us of
CPU per request, against about 1.5 ms for the ``openai`` client (httpx's own pool spends
10-30 ms of CPU per request at hundreds of connections; see docs/engineering-notes.md and
benchmarks/bench_llm.py). The check before a run (``GET /models``) always goes through the aiohttp session.

**What ``timeout=`` bounds.** One deadline per request, ``timeout`` seconds after it takes its
``max_inflight`` slot (the wait for a slot is not counted): each attempt gets what is left of it (a
server that trickles a byte a second does not hold an attempt past it), a retry's backoff or
Retry-After that would end past it is not waited (the request fails at once with the last failure),
and a request ends by it, answered or not. ``timeout=10&retries=1`` ends every request within 10 s.
A replica set (``URL|URL``) sends a request that failed on one replica to another, with a deadline
of its own there (:mod:`negotiate.agents.replicas`).

Errors that are not the model's fault (server down, 401, 404, a context overflow) raise
:class:`LLMError` with the reason, and the episode is recorded as failed. A request that
times out after its retries raises :class:`LLMTimeout`, a ``TimeoutError``: the bus
records it as the agent's silence (a timeout violation) and the episode goes on. After
:data:`DOWN_AFTER` requests in a row have timed out so, the backend takes the server for down:
every later request fails at once with :class:`LLMError` ("the server at URL is down: N requests
in a row timed out"), so a run ends instead of spending every turn of every episode on it.
An error of a server that is not there (refused, reset, down) has ``unreachable`` set: a spec naming
several replicas (``URL|URL``) drains that one and sends the request to another
(:mod:`negotiate.agents.replicas`, one :class:`OpenAIBackend` per replica).

The reply text a trace keeps is cut at :data:`REPLY_MAX` characters, the cut noted in ``extra.clamped``; what the
clients do with a hostile answer is in :mod:`negotiate.agents.clients`.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit, urlunsplit

import orjson
import structlog

from negotiate.errors import UserError
from negotiate.protocol import json_schema

from negotiate.agents.clients import (LLM_INSTALL, MAX_INFLIGHT, _ANSWER_CAP, _broken, _openai_httpx, _read_capped, _Shared, _StatusAnswer,
                                      _status_answer_in, _under, read_bounded, shared_clients)
from negotiate.agents.contract import FORMATS, Completion, LLMError, LLMTimeout, installed, parse_query
from negotiate.agents.pools import current_pools
from negotiate.agents.views import PROMPTS  # the seller's prompt views, by name

__all__ = [
    "OpenAIOptions",
    "OpenAIBackend",
    "parse_openai_spec",
    "openai_options",
    "openai_backend",
    "OPENAI_KEYS",
    "CLIENTS",
    "SERVERS",
    "SERVER_KINDS",
    "SERVER_BY_OWNER",
    "DOWN_AFTER",
    "REPLY_MAX",
]

log = structlog.get_logger("negotiate.llm")

@dataclass(frozen=True)
class ServerKind:
    """How one kind of server takes a request's settings (``server=``)."""

    tokens: str = "max_tokens"
    """The request field of the reply's token budget."""
    schema: Callable[[dict], dict] | None = None
    """The request fields that ask for a reply under a JSON schema (``format=json``); None: none, the prompt describes
    the object."""
    vllm: bool = False
    """vLLM's own fields: the token ids with the log-probs (``return_token_ids``), a regex the reply must match
    (``structured_outputs``: ``legal=1`` and menus) and ``chat_template_kwargs`` (``think=``)."""


SERVER_KINDS: dict[str, ServerKind] = {
    # vLLM >= 0.12; the old guided_json is ignored there
    "vllm": ServerKind(schema=lambda schema: {"structured_outputs": {"json": schema}}, vllm=True),
    "openai": ServerKind(tokens="max_completion_tokens", schema=lambda schema: {"response_format": {
        "type": "json_schema", "json_schema": {"name": schema["title"], "schema": schema, "strict": False}}}),
    # llama.cpp's json_schema form gets HTTP 500; json_object with a schema is what it takes
    "llamacpp": ServerKind(schema=lambda schema: {"response_format": {"type": "json_object", "schema": schema}}),
    "generic": ServerKind(),
}
"""Each kind of server a spec may name, by how it takes a request's settings (a JSON schema for structured output
first); ``auto`` is told by the server's ``GET /models`` (:data:`SERVER_BY_OWNER`)."""
SERVERS = ("auto", *SERVER_KINDS)
"""What ``server=`` takes."""
CLIENTS = ("http", "aiohttp", "openai")
"""HTTP clients: our own HTTP/1.1 client (``negotiate.agents.http1``; the leanest, the default), our
own requests over an ``aiohttp`` session, or the openai package's client."""
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
SERVER_BY_OWNER = {"vllm": "vllm", "me": "llamacpp", "llamacpp": "llamacpp", "llama.cpp": "llamacpp",
                   "openai": "openai", "system": "openai", "openai-internal": "openai"}
"""``server=auto``: the kind of server, by the ``owned_by`` of the model in its ``GET /models``
(llama-cpp-python says ``me``); another owner gets vLLM's form (name ``server=`` for it)."""


DOWN_AFTER = 3
"""Requests in a row that timed out (each at its deadline, retries included) before a backend takes its server for down."""
REPLY_MAX = 100_000
"""Characters of a reply (and of its reasoning) a completion keeps; a longer one is cut, the cut noted."""


def _cut(text, what: str) -> tuple[str, str]:
    """``text`` cut to :data:`REPLY_MAX` characters (a value that is not text: its JSON), and the clamp note."""
    if not isinstance(text, str):
        text = orjson.dumps(text).decode()
        if len(text) <= REPLY_MAX:
            return text, f"{what} was not text; kept as its JSON"
    return text[:REPLY_MAX], f"{what} cut from {len(text)} to {REPLY_MAX} characters"


@dataclass(frozen=True)
class OpenAIOptions:
    """A parsed ``openai:`` agent spec (everything but the key, which stays in the environment)."""

    model: str
    """Model name as the server knows it (``Qwen/Qwen3-8B``)."""
    base_url: str
    """Server URL up to and including ``/v1``; several replicas' URLs joined by ``|`` (:attr:`base_urls`)."""
    format: str = "json"
    """``json`` or ``tagged``."""
    server: str = "auto"
    """``auto`` (told by the server's ``GET /models`` before a run), ``vllm``, ``openai``, ``llamacpp`` or ``generic``."""
    temperature: float = 0.7
    top_p: float | None = None
    """Nucleus sampling; None leaves it to the server."""
    max_tokens: int = 512
    timeout: float = 60.0
    """Seconds a request may take once it goes out (its ``max_inflight`` slot taken), every retry and every wait between
    them included: one deadline, not one per attempt or per read."""
    retries: int = 2
    """Retries on 408/409/429/5xx, connection errors and broken answers (exponential backoff with jitter; Retry-After
    honored), each only where it can start before the request's deadline."""
    reask: int = 0
    """Re-asks after an unparseable reply."""
    max_inflight: int = MAX_INFLIGHT
    """Requests in flight to this server with this key, across the process's episodes."""
    logprobs: bool = True
    """Ask for log-probs (and, on vLLM, token ids)."""
    think: bool | None = None
    """vLLM ``chat_template_kwargs.enable_thinking``; None sends nothing."""
    key_env: str = DEFAULT_KEY_ENV
    """Environment variable holding the API key."""
    client: str = "http"
    """``http`` (our own HTTP/1.1 client), ``aiohttp`` (our requests over an aiohttp session) or ``openai``
    (the openai package's client)."""
    max_answer_mb: float = 8.0
    """MiB an answer's body may have, as sent and inflated (every client); past it the request fails."""
    legal: bool = False
    """Decode the seller's tagged reply under a regex of the replies the rules allow (vLLM only)."""
    grounded: bool = False
    """With ``legal`` and ``prompt=facts`` (or ``advice``): decode under a regex whose thought is a reason stating the prompt's facts."""
    prompt: str = "full"
    """The seller's prompt: ``full``, ``compact`` (each buyer's thread of actions, no talk; tagged replies), ``facts``
    (compact, with the turns each buyer has and each bidder's last bids and trend), ``advice`` (facts, and the message
    the planner would send: ``Advice: to b2, [OFFER] p1 $450 (hold out)``) or ``tools`` (advice, and greedy's message
    on the next line: ``Greedy: to b1, [ACCEPT] p2 $400``)."""

    def to_params(self) -> dict:
        return asdict(self)

    @property
    def base_urls(self) -> tuple[str, ...]:
        """The servers' URLs: one, or the replicas of ``URL|URL|...`` (``negotiate.agents.replicas`` balances them)."""
        return tuple(self.base_url.split("|"))


_NUMBERS: dict[str, tuple[type, float, bool, float]] = {
    "temperature": (float, 0.0, True, 2.0),
    "top_p": (float, 0.0, False, 1.0),
    "max_tokens": (int, 1, True, 1_000_000),
    "timeout": (float, 0.0, False, 3600.0),
    "retries": (int, 0, True, 20),
    "reask": (int, 0, True, 10),
    "max_inflight": (int, 1, True, 100_000),
    "max_answer_mb": (float, 0.0, False, 4096.0),
}
"""Numeric spec keys: type, low bound, whether the low bound is allowed, high bound."""
_FLAGS = ("logprobs", "think", "legal", "grounded")
_CHOICES = {"format": FORMATS, "server": SERVERS, "client": CLIENTS, "prompt": PROMPTS}
OPENAI_KEYS = (*_CHOICES, *_NUMBERS, *_FLAGS, "key_env")
"""Every key an ``openai:`` spec takes (``negotiate agents`` lists them)."""


def parse_openai_spec(rest: str, *, field: str, text: str) -> OpenAIOptions:
    """Parse what follows ``openai:`` in an agent spec; raise a :class:`UserError` naming ``field`` and ``text``."""

    def fail(message: str) -> UserError:
        return UserError(message, field=field, value=text)

    found = re.fullmatch(r"(?P<model>[^@\s]+)@(?P<url>\S+)", rest.strip())
    if not found:
        raise fail("an openai agent is openai:MODEL@BASE_URL[|BASE_URL...][?key=value...], e.g. openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    urls, mark, query = found["url"].partition("?")
    base_urls = [_base_url(text, fail) for text in urls.split("|")]  # replicas: URL|URL|... (negotiate.agents.replicas)
    twice = sorted({url for url in base_urls if base_urls.count(url) > 1})
    if twice:
        raise fail(f"base URL {twice[0]} is given twice; name each replica once")
    url = urlsplit(base_urls[0] + mark + query)
    values: dict = {"model": found["model"], "base_url": "|".join(base_urls)}
    if url.netloc.split(":")[0].lower() == "api.openai.com":
        values["server"] = "openai"
    def special(key: str, value: str) -> bool:
        if key in ("key", "api_key", "token"):
            raise fail("an API key never goes in a spec (specs are written into traces); "
                       f"put it in an environment variable, {DEFAULT_KEY_ENV} or one named with key_env=NAME")
        if key != "key_env":
            return False
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise fail(f"key_env={value!r} is not an environment variable name")
        if value not in os.environ:
            raise fail(f"key_env={value}: that environment variable is not set")
        return True

    values.update(parse_query(url.query, _NUMBERS, _CHOICES, _FLAGS, what="an openai agent", fail=fail,
                              special=special, keys=OPENAI_KEYS))
    options = OpenAIOptions(**values)
    # Checked here, like hf:'s torch: the core install has no HTTP client, and a run must not start without one.
    missing = [name for name in ("aiohttp", "openai" if options.client == "openai" else None) if name and not installed(name)]
    if missing:
        raise fail(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; an openai agent needs "
                   f"the llm extra: {LLM_INSTALL}")
    return options


def _base_url(text: str, fail) -> str:
    """One server's base URL of a spec, checked and without a trailing slash. A URL that ``urllib`` cannot read (an
    IPv6 address without its closing bracket, ``http://[::1/v1``; a port that is no port) is refused here, in one line,
    not in a traceback where the client first reads it."""
    try:
        url = urlsplit(text)
        url.port  # noqa: B018 -- read for its check: a port out of range or not a number raises
    except ValueError as error:
        raise fail(f"base URL {text!r} is not a valid URL ({error}); write it like http://127.0.0.1:8000/v1, an IPv6 "
                   "address in brackets: http://[::1]:8000/v1") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise fail(f"base URL {text!r} is not an http(s) URL like http://127.0.0.1:8000/v1")
    if re.search(r",\s*https?://", text):
        raise fail(f"base URL {text!r} holds several URLs; separate replicas with |, like http://a:8000/v1|http://b:8000/v1")
    if "@" in url.netloc:
        raise fail("put no credentials in the base URL; the key comes from an environment variable (key_env=NAME)")
    return urlunsplit((url.scheme, url.netloc, url.path.rstrip("/"), "", ""))


def openai_options(pools, params: dict) -> OpenAIOptions:
    """The options of a parsed ``openai:`` spec, built once per distinct spec in ``pools``' run."""
    return pools.memo(("openai-options", *params.items()), lambda: OpenAIOptions(**params))


def openai_backend(pools, options: OpenAIOptions) -> OpenAIBackend:
    """The one backend of ``options`` in ``pools``' run."""
    return pools.memo(("openai", options), lambda: OpenAIBackend(options, pools=pools))


# -- the backend -------------------------------------------------------------------------


def _message_in(data: dict) -> str | None:
    """The message of an error object: ``message``, FastAPI's ``detail``, or a nested ``error``."""
    message = data.get("message") or data.get("detail") or data.get("error")
    if isinstance(message, dict):
        message = message.get("message")
    return str(message) if message else None


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible server."""

    name = "openai"

    def __init__(self, options: OpenAIOptions, *, pools=None):
        self.options = options
        self.pools = pools
        """The run's pools (:class:`~negotiate.agents.pools.Pools`); None: the current context's, at each lookup."""
        self._schemas = {role: json_schema(role) for role in ("seller", "buyer")}
        self._url = None
        """The chat-completions URL as a ``yarl.URL`` (parsed once, not per request; ``client=aiohttp``)."""
        self._target = urlsplit(options.base_url).path + "/chat/completions"
        """The chat-completions request target (``client=http``)."""
        self._timeout = None
        """``aiohttp.ClientTimeout`` of this backend's requests (made on first use)."""
        self._shared: tuple | None = None
        """(event loop, pools, their generation, _Shared): the last lookup, reused while all three hold."""
        self.server = "vllm" if options.server == "auto" else options.server
        """The server kind requests are shaped for: the spec's, or what :meth:`preflight` found (``auto``)."""
        self._limit = int(options.max_answer_mb * 2**20)
        """The cap on an answer's body in bytes (``max_answer_mb``)."""
        self.timeouts_in_a_row = 0
        """Requests that timed out (at their deadline) since the last answer; at :data:`DOWN_AFTER` the server is down."""
        self.down: str | None = None
        """Why the server is taken for down (every later request fails with it at once); None while it is not."""

    def describe(self) -> dict:
        o = self.options
        return {"backend": "openai", "model": o.model, "base_url": o.base_url, "format": o.format, "server": self.server}

    def revive(self) -> None:
        """Take the server for up again: forget :attr:`down` and the timeouts in a row (a replica set does, when a
        drained replica answers or is tried again: ``negotiate.agents.replicas``)."""
        self.down = None
        self.timeouts_in_a_row = 0

    def request(self, messages: list[dict], *, role: str, seed: int | None = None, constraint: str | None = None) -> dict:
        """The JSON body of one chat-completions request; ``constraint``: a regex the reply must match (vLLM)."""
        o = self.options
        body: dict = {"model": o.model, "messages": messages, "temperature": o.temperature}
        kind = SERVER_KINDS[self.server]
        body[kind.tokens] = o.max_tokens
        if o.top_p is not None:
            body["top_p"] = o.top_p
        if seed is not None:
            body["seed"] = seed
        if o.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
            if kind.vllm:
                body["return_token_ids"] = True
        if o.format == "json" and kind.schema is not None:  # generic: none; the prompt describes the object
            body.update(kind.schema(self._schemas[role]))
        if constraint is not None:  # legal=1: the spec and preflight made sure the server is vLLM
            body["structured_outputs"] = {"regex": constraint}
        if o.think is not None and kind.vllm:
            body["chat_template_kwargs"] = {"enable_thinking": o.think}
        return body

    async def complete(self, messages: list[dict], *, role: str, seed: int | None = None, constraint: str | None = None) -> Completion:
        """One chat completion (``constraint``: a regex the reply must match). Raises :class:`LLMError` or
        :class:`LLMTimeout`; never waits past its deadline."""
        o = self.options
        loop = asyncio.get_running_loop()
        pools = self.pools or current_pools()
        cached = self._shared
        if cached is not None and cached[0] is loop and cached[1] is pools and cached[2] == pools.generation:
            shared = cached[3]
        else:
            shared = shared_clients(pools, o)
            self._shared = (loop, pools, pools.generation, shared)
        requests = pools.requests.logger
        where = f"{o.model} at {o.base_url}"
        if self.down is not None:
            raise LLMError(self.down, unreachable=True)
        payload = orjson.dumps(self.request(messages, role=role, seed=seed, constraint=constraint))  # serialized once, by orjson
        try:
            try:
                waiting = pools.requests.begin()  # the run's progress line counts the requests that keep it waiting
                try:
                    data, retries, latency = await self._post(shared, payload, where)
                finally:
                    pools.requests.end(waiting)
            except LLMTimeout:
                self.timeouts_in_a_row += 1
                if self.timeouts_in_a_row >= DOWN_AFTER and self.down is None:  # one reason for every later request
                    self.down = f"{where}: the server at {o.base_url} is down: {DOWN_AFTER} requests in a row timed out"
                raise
            self.timeouts_in_a_row = 0
        except (LLMError, LLMTimeout) as error:
            if requests is not None:
                requests.warning("llm request failed", backend="openai", model=o.model, base_url=o.base_url, role=role,
                                           error=str(error))
            raise
        except asyncio.CancelledError:  # the market closed, or the agent's deadline passed, while it was asked
            if requests is not None:
                requests.info("llm request cancelled", backend="openai", model=o.model, base_url=o.base_url, role=role)
            raise
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
            text = message.get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise LLMError(f"{where}: the server's answer has no choices[0].message: {str(data)[:300]}") from None
        logprobs = None
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        if content:
            logprobs = [entry.get("logprob") for entry in content]
        clamped = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if not isinstance(text, str) or len(text) > REPLY_MAX:
            text, note = _cut(text, "the reply")
            clamped.append(note)
        if reasoning is not None and (not isinstance(reasoning, str) or len(reasoning) > REPLY_MAX):
            reasoning, note = _cut(reasoning, "the reasoning")
            clamped.append(note)
        completion = Completion(
            text=text,
            finish_reason=choice.get("finish_reason"),
            model=data.get("model") or o.model,
            latency_s=latency,
            retries=retries,
            usage=data.get("usage"),
            token_ids=choice.get("token_ids"),
            prompt_token_ids=data.get("prompt_token_ids"),
            logprobs=logprobs,
            reasoning=reasoning,
            clamped=tuple(clamped),
        )
        if requests is not None:  # every request, through structlog's lean path (negotiate.logs)
            usage = completion.usage or {}
            requests.info("llm request", backend="openai", model=o.model, base_url=o.base_url, role=role,
                                    latency_s=round(latency, 4), retries=retries, finish_reason=completion.finish_reason,
                                    prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
        return completion

    async def preflight(self) -> None:
        """``GET /models`` once before a run: the server answers, the key works, the model is served,
        and (``server=auto``) which kind of server it is. Raises :class:`LLMError` with the reason.
        A server with no models list (404) must answer a one-token chat request instead (every episode
        would fail otherwise); one that answers ``/models`` with no usable list is taken on trust."""
        import aiohttp

        o = self.options
        where = f"{o.model} at {o.base_url}"
        limit = min(o.timeout, 30.0)

        async def ask(method: str, path: str, data: bytes | None = None) -> tuple[int, bytes]:
            try:
                async with shared_clients(self.pools or current_pools(), o).aiohttp().request(method, o.base_url + path, data=data, allow_redirects=False,
                                                        headers={"Content-Type": "application/json"} if data else None,
                                                        timeout=aiohttp.ClientTimeout(total=limit)) as response:
                    return response.status, await read_bounded(response, self._limit)
            except TimeoutError:
                raise LLMError(f"{where}: no answer to {method} {path} within {limit:g}s", unreachable=True) from None
            except aiohttp.ClientError as error:
                cause = getattr(error, "os_error", None) or error
                raise LLMError(f"{where}: cannot reach the server ({type(cause).__name__}: {cause})", unreachable=True) from None
            except OSError as error:  # a broken or oversized answer (read_bounded's)
                raise LLMError(f"{where}: {method} {path}: {error} (the spec's max_answer_mb={o.max_answer_mb:g})") from None

        status, body = await ask("GET", "/models")
        if status in (401, 403):
            raise _status_error(status, _message(body), where, o)
        try:
            listed = orjson.loads(body)["data"] if status < 300 else None
            models = {str(m["id"]): m.get("owned_by") for m in listed}
        except (orjson.JSONDecodeError, KeyError, TypeError):
            models = None
        if not models:
            if status == 404:
                chat = orjson.dumps({"model": o.model, "max_tokens": 1, "messages": [{"role": "system", "content": "Answer OK."},
                                                                                     {"role": "user", "content": "OK?"}]})
                answer, reply = await ask("POST", "/chat/completions", chat)
                if answer >= 300:
                    hint = (f"; an OpenAI-compatible base URL usually ends in /v1, like {o.base_url}/v1"
                            if not o.base_url.endswith("/v1") else "")
                    raise LLMError(f"{where}: GET {o.base_url}/models is not found (404) and a one-token chat request "
                                   f"answers {answer} ({_message(reply)}){hint}")
            log.warning("server lists no models; model name and server kind not checked", base_url=o.base_url, status=status)
            return
        if o.model not in models:
            shown = ", ".join(sorted(models)[:8]) + (", ..." if len(models) > 8 else "")
            raise LLMError(f"{where}: the server does not serve {o.model!r}; it serves {shown}")
        if o.server == "auto":
            self.server = SERVER_BY_OWNER.get(str(models[o.model]).lower(), "vllm")
            log.info("server kind", base_url=o.base_url, owned_by=models[o.model], server=self.server)
        if o.legal and not SERVER_KINDS[self.server].vllm:
            raise LLMError(f"{where}: legal=1 needs a vLLM server (its structured_outputs regex); this one is {self.server}")

    # -- the request: our own retries, deadline and errors, over any of the three clients --------------

    async def _post(self, shared: _Shared, payload: bytes, where: str) -> tuple[dict, int, float]:
        """POST the body; (the answer's JSON, retries, latency). One deadline, ``timeout`` seconds once the request has
        its slot: each attempt gets what is left of it, and a retry (408/409/429/5xx, connection errors, broken
        answers; after its backoff, Retry-After honored) is made only where its wait ends before it."""
        from negotiate.agents.http1 import AnswerTooLarge, BrokenAnswer

        o = self.options
        sender = {"http": self._http_sender, "aiohttp": self._aiohttp_sender, "openai": self._openai_sender}[o.client]
        send, errors = sender(shared, payload)
        loop = asyncio.get_running_loop()
        attempt = 0
        async with shared.limiter:
            began = time.perf_counter()
            deadline = loop.time() + o.timeout
            while True:
                failure: BaseException | None = None
                headers = None
                try:
                    status, headers, body = await send(deadline)
                except AnswerTooLarge as error:  # the same answer again would be as large: not retried
                    raise LLMError(f"{where}: {error} (the spec's max_answer_mb={o.max_answer_mb:g} raises it)") from None
                except errors as error:  # refused, reset, disconnected, a broken answer, the deadline
                    failure, status = error, 0
                if failure is None and status < 300:
                    break
                if attempt < o.retries and _retriable(status, headers):
                    wait = _backoff(attempt, headers)
                    if loop.time() + wait < deadline:  # else: no time for it; the last failure is the answer
                        await asyncio.sleep(wait)
                        attempt += 1
                        continue
                if failure is None:
                    raise _status_error(status, _message(body), where, o) from None
                if isinstance(failure, TimeoutError):
                    made = f"{attempt} retr{'y' if attempt == 1 else 'ies'}"
                    raise LLMTimeout(f"{where}: no reply within {o.timeout:g}s (the spec's timeout, {made} included)") from None
                if isinstance(failure, BrokenAnswer) and "closed the connection" not in str(failure):
                    raise LLMError(f"{where}: the server's answer is broken: {failure}") from None
                cause = getattr(failure, "os_error", None) or failure
                raise LLMError(f"{where}: cannot reach the server ({type(cause).__name__}: {cause})", unreachable=True) from None
            latency = time.perf_counter() - began
        try:
            return orjson.loads(body), attempt, latency
        except orjson.JSONDecodeError as error:
            raise LLMError(f"{where}: the server's answer is not JSON ({error})") from None

    def _http_sender(self, shared: _Shared, payload: bytes):
        """``client=http``: one attempt on our own pool, given what is left of the deadline, and the errors it raises."""
        pool, target, limit = shared.http1(), self._target, self._limit
        loop = asyncio.get_running_loop()

        async def send(deadline: float) -> tuple[int, object, bytes]:
            return await pool.request(b"POST", target, payload, deadline - loop.time(), limit)

        return send, (OSError,)  # TimeoutError is one

    def _aiohttp_sender(self, shared: _Shared, payload: bytes):
        """``client=aiohttp``: one attempt over the shared aiohttp session, by the deadline, and the errors it raises."""
        import aiohttp

        o = self.options
        session = shared.aiohttp()
        if self._timeout is None:
            import yarl

            # No aiohttp timers: asyncio.timeout_at below bounds each attempt, at a third of their CPU.
            self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)
            self._url = yarl.URL(o.base_url + "/chat/completions")
        url, timeout = self._url, self._timeout
        limit = self._limit

        async def send(deadline: float) -> tuple[int, object, bytes]:
            try:
                async with asyncio.timeout_at(deadline):  # the request's deadline, not one per read
                    async with session.post(url, data=payload, timeout=timeout, allow_redirects=False) as response:
                        status = response.status
                        return status, response.headers if status >= 300 else None, await read_bounded(response, limit)
            except aiohttp.ClientError as error:  # its parser's verdict on a broken answer: said as ours is
                raise _broken(error) from None

        return send, (OSError, aiohttp.ClientError)  # TimeoutError is an OSError

    def _openai_sender(self, shared: _Shared, payload: bytes):
        """``client=openai``: one attempt through the openai client (its own retries off: ours count, by the deadline),
        its answer read under the cap, an error answer included (:func:`_read_status_answer`); the errors it raises,
        unwrapped from the openai client's to what happened."""
        import aiohttp
        import openai

        httpx2 = _openai_httpx()
        client, limit = shared.client, self._limit
        # identity: as our other clients, ask for no compression (a gzip answer is still inflated, under the cap)
        options = {"timeout": httpx2.Timeout(self.options.timeout, connect=min(self.options.timeout, 10.0)), "max_retries": 0,
                   "headers": {"Accept-Encoding": "identity"}}

        async def send(deadline: float) -> tuple[int, object, bytes]:
            _ANSWER_CAP.set(limit)
            try:
                async with asyncio.timeout_at(deadline):
                    # The client's low-level post, without the typed parameter transform of chat.completions.create
                    # (a millisecond of CPU per request here). stream=True: the body is ours to read, under the cap.
                    streamed = await client.post("/chat/completions", content=payload, cast_to=httpx2.Response,
                                                 options=options, stream=True, stream_cls=openai.AsyncStream[dict])
                    response = getattr(streamed, "response", streamed)  # openai 3 wraps it in the stream class
                    try:
                        return response.status_code, None, await _read_capped(response, limit)
                    except BaseException:
                        # Not back to the pool: the unread rest of this answer would meet the next request.
                        stream = getattr(response, "stream", None)
                        stream = getattr(stream, "_stream", stream)  # httpx's BoundAsyncStream around the transport's
                        raw = getattr(stream, "_aiohttp_response", None)
                        if raw is not None:
                            raw.close()
                        raise
                    finally:
                        await response.aclose()
            except (_StatusAnswer, openai.APIConnectionError, httpx2.HTTPError, aiohttp.ClientError) as error:
                answer = _status_answer_in(error)  # read under the cap by the response hook: raised through, or wrapped (openai 2)
                if answer is not None:
                    return answer.status, answer.headers, answer.body
                raise _broken(_under(error)) from None

        return send, (OSError, aiohttp.ClientError)


def _status_error(status: int, message: str, where: str, o: OpenAIOptions) -> LLMError:
    """The error for an HTTP error status (after the retries, where it is retried), its ``status`` set."""
    error = _status_error_of(status, message, where, o)
    error.status = status
    return error


def _status_error_of(status: int, message: str, where: str, o: OpenAIOptions) -> LLMError:
    if status == 401:
        return LLMError(f"{where}: authentication failed (401): {message}; set the key in ${o.key_env}")
    if status == 403:
        return LLMError(f"{where}: permission denied (403): {message}")
    if status == 404:
        return LLMError(f"{where}: not found (404): {message}; check the model name "
                        f"(GET {o.base_url}/models lists them) and that the URL ends in /v1")
    if status == 429:
        return LLMError(f"{where}: rate limited (429) after {o.retries} retries: {message}")
    # 400 (a context overflow, a bad parameter), 422, 5xx after the retries
    return LLMError(f"{where}: request failed ({status}): {message}")


def _message(body: bytes) -> str:
    """The message of an error answer: OpenAI's ``{"error": {"message": ...}}``, FastAPI's ``detail``, or the text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace").strip() or "(no message)"
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            found = _message_in(inner)
            if found:
                return found
        elif inner:
            return str(inner)
    return str(data)[:300]


RETRY_STATUSES = frozenset({408, 409, 429})
"""Retried besides every 5xx and connection errors (as the openai client does)."""
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 8.0
RETRY_AFTER_MAX = 60.0
"""A server's Retry-After up to this many seconds is honored; a longer one gets the usual backoff."""


def _retriable(status: int, headers) -> bool:
    if status == 0:  # a connection error or a timeout
        return True
    should = headers.get("x-should-retry") if headers is not None else None
    if should == "true":
        return True
    if should == "false":
        return False
    return status in RETRY_STATUSES or status >= 500


def _retry_after(headers) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, or ``retry-after`` in seconds or as an HTTP date)."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime

        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _backoff(attempt: int, headers) -> float:
    """Seconds before retry ``attempt + 1``: the server's Retry-After, else exponential backoff with jitter."""
    after = _retry_after(headers)
    if after is not None and 0 < after <= RETRY_AFTER_MAX:
        return after
    return min(BACKOFF_INITIAL * 2.0**attempt, BACKOFF_MAX) * (1.0 - 0.25 * random.random())
