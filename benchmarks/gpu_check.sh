#!/usr/bin/env bash
# The GPU check: a few steps of the trainer and the hf backend on a CUDA machine that has torch,
# transformers and peft but no vLLM and no network (benchmarks/README.md, "gpu_check.sh").
#
#   bash benchmarks/gpu_check.sh MODEL_FOLDER OUT
#
# MODEL_FOLDER: a transformers folder with config.json and the tokenizer (SmolLM2-135M's: `negotiate
# loop` exports one to OUT/base); its weights are not read: the models get random weights, so this
# times the arithmetic and runs the code paths, and says nothing about learning.
# Wheels in $WHEELS (default .whl/: the package's own and any dependency the machine lacks) are
# installed first. Each step has its own time limit, and the next one runs whatever the last did.
# QUICK=1 shrinks every step to a dry run of the commands (minutes on a CPU).
set -u
if [ ! -f "${1:?a model folder (config.json and tokenizer)}/config.json" ]; then
    echo "gpu_check.sh: $1: not a transformers folder (no config.json there)" >&2
    exit 2
fi
model=$(realpath "$1")
mkdir -p "${2:?an output folder}"
out=$(realpath "$2")
repo=$(pwd)
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" "$wheels"/*.whl || exit 1
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
step() {  # step SECONDS NAME COMMAND...: run it with a limit, say how long it took and how it ended
    local limit=$1 name=$2
    shift 2
    echo "== $name"
    local began=$SECONDS
    timeout "$limit" "$@"
    echo "== $name: exit $? after $((SECONDS - began)) s"
}
if [ "${QUICK:-0}" = 1 ]; then
    bench=(--episodes 5 --decisions 4 --micro 2 --batch 2 --max-tokens 4 --repeat 1) markets=20 steps=2 size=4 served=4 online=(2 2 4 8)
else
    bench=(--shape qwen3-1.7b --episodes 40 --decisions 64 --micro 8,32 --batch 32,128) markets=200 steps=40 size=32 served=64 online=(4 4 16 48)
fi
cd "$work"  # not the checkout, whose negotiate/ folder would shadow the installed package
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
"$py" -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__, '| peft', peft.__version__)"

step 240 "bench_gpu: seconds per decision, SmolLM2-135M and Qwen3-1.7B shapes" \
    "$py" "$repo/benchmarks/bench_gpu.py" --model "$model" --random-weights "${bench[@]}" --json "$out/bench_gpu.json" --save-random "$work/random"
step 60 "teacher: greedy on $markets compact markets" \
    "$py" -m negotiate serve --seller greedy --split "$repo/specs/compact.toml" --episodes $markets --seed 0 --out "$work/teacher" --quiet
step 180 "negotiate train --method sft, $steps steps of $size decisions, bf16, on the GPU" \
    "$py" -m negotiate train --method sft --model "$work/random" --traces "$work/teacher" --max-steps $steps --batch-size $size \
    --set micro_batch=$size --set bf16=true --eval-episodes 0 --out "$work/sft"
cp "$work/sft/train.json" "$work/sft/metrics.jsonl" "$out/" 2>/dev/null
step 180 "negotiate train --method online-grpo (TRL's GRPOTrainer, rollouts by transformers), ${online[0]} steps of ${online[2]}" \
    "$py" -m negotiate train --method online-grpo --model "$work/random" --set split="$repo/specs/compact.toml" --max-steps ${online[0]} \
    --set group=${online[1]} --batch-size ${online[2]} --set max_tokens=${online[3]} --set bf16=true --eval-episodes 0 --out "$work/online"
cp "$work/online/train.json" "$out/online-train.json" 2>/dev/null
cp "$work/online/metrics.jsonl" "$out/online-metrics.jsonl" 2>/dev/null
step 120 "negotiate serve --seller hf: (the trained checkpoint, bf16, on the GPU), $served markets" \
    "$py" -m negotiate serve --seller "hf:$work/sft?format=tagged&batch=64&max_tokens=64&dtype=bfloat16" --split "$repo/specs/compact.toml" \
    --episodes $served --seed 7 --out "$work/hf" --quiet
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1
