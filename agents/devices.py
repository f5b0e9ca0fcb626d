"""What this machine's processor can do for a model: the dtypes a local model runs in, and which of them is fast here.

Read by the ``vllm:`` backend (its engine's dtype on a CPU), the vLLM server the loop starts and the trainer's bf16
default, so all three decide the same way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DTYPES", "BF16_FLAGS", "cpu_bf16", "auto_dtype"]

DTYPES = ("float32", "bfloat16", "float16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags (``/proc/cpuinfo``) of bf16 instructions: with one of them bf16 runs faster than fp32 here (the loop's
training 2.3x, vLLM about 2x); without, much slower (an AVX2 EPYC: training 18.6x, vLLM 4.8x; benchmarks/)."""


def cpu_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bf16 instructions (:data:`BF16_FLAGS`); False where ``cpuinfo`` cannot be read.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", delete=False) as f:
    ...     _ = f.write("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    >>> cpu_bf16(f.name), os.remove(f.name)
    (True, None)
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return any(flag in BF16_FLAGS for flag in line.partition(":")[2].split())
    return False


def auto_dtype(device: str) -> str:
    """The dtype ``auto`` means on ``device``: bf16 on a GPU and on a CPU with bf16 instructions, else float32."""
    return "bfloat16" if device != "cpu" or cpu_bf16() else "float32"

