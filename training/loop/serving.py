"""The policy in service during a loop run (:class:`Serving`): the vLLM server the loop starts (one port for the
whole run, its log in ``OUT/server/``), or the one given by ``--server-url``, and which model name answers for each
round: a hot-loaded LoRA adapter on one server on the base model, or a fresh server on the round's merged weights.
``--serve auto`` times the two ways once, after SFT (:meth:`Serving.decide`). Starting, stopping and talking to
a vLLM server is :mod:`negotiate.training.server`'s (the benchmarks and the vLLM tests use it too)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import structlog

from negotiate.training.loop.config import LoopConfig
from negotiate.training.loop.state import State
from negotiate.training.server import ServerSpec, VLLMServer, detect_device, load_adapter, served_models

__all__ = ["Serving"]

log = structlog.get_logger("negotiate.loop")


class Serving:
    """The policy in service: which server, which model name, for which round."""

    def __init__(self, config: LoopConfig, out: Path, base: Path, state: State):
        self.config, self.out, self.base, self.state = config, out, base, state
        self.server: VLLMServer | None = None
        self.serving: str | None = None
        """What the started server serves: ``base`` or ``round-K`` (merged)."""
        self.loaded: set[str] = set()

    @property
    def mode(self) -> str:
        if self.config.server_url:
            return "adapter"
        decided = (self.state.data.get("serving") or {}).get("mode")
        return decided or ("adapter" if self.config.serve == "auto" else self.config.serve)

    def port(self) -> int:
        """One port for the run: the specs of resumable stages name the server's URL, so a restarted server keeps it."""
        if self.config.port is not None:
            return self.config.port
        if not self.state.data.get("port"):
            from negotiate.training.server import free_port

            self.state.data["port"] = free_port()
            self.state.save()
        return self.state.data["port"]

    def _start(self, model: Path, name: str, *, lora: bool) -> str:
        self.stop()
        spec = ServerSpec(model=str(model), name=name, port=self.port(), enable_lora=lora, max_lora_rank=self.config.lora_r,
                          max_model_len=4096)
        self.server = VLLMServer(spec, self.out / "server")
        url = self.server.start()
        self.serving, self.loaded = name, set()
        return url

    def policy(self, round_no: int | None) -> tuple[str, str]:
        """(base URL, model name) serving round ``round_no``'s policy (None: the untrained model)."""
        checkpoint = None if round_no is None else self.out / f"round-{round_no:02d}" / "checkpoint"
        name = "base" if round_no is None else f"round-{round_no}"
        if self.config.server_url:
            url = self.config.server_url.rstrip("/")
            if round_no is None:
                return url, served_models(url)[0]
        elif self.mode == "merged":
            if self.serving != name or not self.server or not self.server.alive():
                self._start(self.base if checkpoint is None else checkpoint, name, lora=False)
            return self.server.base_url, name
        else:
            if self.serving != "base" or not self.server or not self.server.alive():
                self._start(self.base, "base", lora=True)
            url = self.server.base_url
            if round_no is None:
                return url, "base"
        if name not in self.loaded:
            load_adapter(url, name, checkpoint / "adapter")
            self.loaded.add(name)
        return url, name

    def down(self) -> bool:
        """Whether the server this loop started has died (a server given by ``--server-url`` is not the loop's to tell)."""
        return self.server is not None and not self.server.alive()

    def restart(self, round_no: int | None) -> tuple[str, str]:
        """Serve round ``round_no``'s policy on a fresh server (same port: the stages' specs name its URL), after a
        stage's episodes failed; a server given by ``--server-url`` is not the loop's to restart, and is asked again."""
        if not self.config.server_url:
            self.stop()
        return self.policy(round_no)

    def before_training(self) -> None:
        """On merged serving the server is stopped while the trainer runs (2 cores, and its RAM)."""
        if self.mode == "merged":
            self.stop()

    def decide(self) -> None:
        """``--serve auto``: time the same requests on the base model and with round 0's adapter, once."""
        if self.state.data.get("serving") or self.config.server_url or self.config.serve != "auto":
            if not self.state.data.get("serving"):
                self.state.data["serving"] = {"mode": self.mode, "why": "chosen" if not self.config.server_url else "--server-url"}
                self.state.save()
            return
        url = self._start(self.base, "base", lora=True)
        load_adapter(url, "round-0", self.out / "round-00" / "checkpoint" / "adapter")
        seconds = {name: _time_requests(url, name) for name in ("base", "round-0", "base")}
        base_s, adapter_s = seconds["base"], seconds["round-0"]
        ratio = adapter_s / base_s if base_s > 0 else float("inf")
        mode = "merged" if ratio > 1.5 else "adapter"
        self.state.data["serving"] = {"mode": mode, "base_s": round(base_s, 3), "adapter_s": round(adapter_s, 3), "ratio": round(ratio, 2),
                                      "device": detect_device(), "why": "measured: adapter requests vs base requests on this machine"}
        self.state.save()
        log.info("serving chosen", **self.state.data["serving"])
        self.loaded = {"round-0"}
        if mode == "merged":
            self.stop()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.serving, self.loaded = None, None, set()


def _time_requests(url: str, model: str, count: int = 4) -> float:
    """Seconds for ``count`` concurrent short completions of one fixed prompt (the server's own speed)."""
    import concurrent.futures
    import urllib.request

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "You sell sofas. Make an offer to a buyer. " * 20}],
                       "max_tokens": 24, "temperature": 0, "ignore_eos": True}).encode()

    def one(_):
        request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - began
