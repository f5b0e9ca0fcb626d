"""The local backends' former module: ``hf:`` is :mod:`negotiate.agents.hf`, ``vllm:`` is
:mod:`negotiate.agents.vllm_engine`, the dtype a CPU runs fast is :mod:`negotiate.agents.devices`, and the table that
picks a backend is :mod:`negotiate.agents.backends`. The names other modules imported from here are still here.
"""

from __future__ import annotations

from negotiate.agents.backends import BACKENDS, preload
from negotiate.agents.contract import installed as _installed  # noqa: F401 -- the name tests stand in for
from negotiate.agents.devices import BF16_FLAGS, DTYPES, auto_dtype, cpu_bf16
from negotiate.agents.hf import (ALIASES, HF_INSTALL, HF_KEYS, SMOLLM2_INSTALL, HFBackend, HFOptions, encode_chat, local_model,
                                 parse_hf_spec, smollm2_path, stop_tokens)
from negotiate.agents.hf import _Batcher, _Chosen, _common_prefix, _Generated, _Job, _LocalModel, _prefill, _sample  # noqa: F401
from negotiate.agents.vllm_engine import (VLLM_INSTALL, VLLM_KEYS, VLLM_MISSING, VLLMBackend, VLLMOptions, completion_from_vllm,
                                          parse_vllm_spec, shutdown_engines)
from negotiate.agents.vllm_engine import _engines  # noqa: F401

__all__ = [
    "HFOptions",
    "HFBackend",
    "VLLMOptions",
    "VLLMBackend",
    "parse_hf_spec",
    "parse_vllm_spec",
    "local_backend",
    "local_options",
    "preload",
    "smollm2_path",
    "encode_chat",
    "stop_tokens",
    "local_model",
    "completion_from_vllm",
    "shutdown_engines",
    "HF_INSTALL",
    "HF_KEYS",
    "SMOLLM2_INSTALL",
    "VLLM_INSTALL",
    "VLLM_KEYS",
    "VLLM_MISSING",
    "ALIASES",
    "DTYPES",
    "BF16_FLAGS",
    "cpu_bf16",
    "auto_dtype",
]


def local_backend(pools, kind: str, options):
    """The one ``hf`` or ``vllm`` backend of ``options`` in ``pools``' run (:data:`~negotiate.agents.backends.BACKENDS`)."""
    return BACKENDS[kind].backend(pools, options)


def local_options(spec):
    """The options of a parsed ``hf:`` or ``vllm:`` spec."""
    return BACKENDS[spec.backend].options(**spec.params)
