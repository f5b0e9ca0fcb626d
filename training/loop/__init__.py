"""``negotiate loop``: the closed loop, unattended. Imitate a teacher, then rounds of collect -> train
-> serve the new policy -> evaluate on held-out markets, with vLLM generating every reply.

One folder per run (``--out``)::

    loop.json                 the config, the finished stages, each round's held-out summary
    base/                     the starting model as a transformers folder (what vLLM serves)
    baselines/BUYERS/         the scripted ladder and the untrained model on the held-out markets
    round-00/teacher/         the teacher's episodes (serve)        -> SFT
    round-00/checkpoint/      merged weights + adapter/ (train --method sft)
    round-00/eval/BUYERS/     held-out episodes of the round's policy (eval)
    round-KK/rollouts/        G x M episodes of the previous round's policy (collect)
    round-KK/checkpoint/      rft, dagger or offline GRPO on them, continuing the previous adapter
    round-KK/eval/BUYERS/
    server/                   the vLLM server's log and pid
    curve.png, results.md     per-round curve; every row paired on the same held-out markets

Each stage is a typed config (a ``TrainConfig``, or a ``RunConfig`` with its ``RunOptions``) written as the TOML file
beside its folder and run as a ``negotiate`` command in a child process (``serve``, ``train``, ``collect``, ``eval``
with ``--config FILE``), so everything a round writes is a trace or a checkpoint the other commands read, and a
stage's memory (a model in training) is given back when it ends. A stage is recorded in
``loop.json`` only once it finished; a rerun of the same command skips finished stages and
resumes or redoes the one that was cut (runs resume with ``--resume``; a cut training starts
over). No finished round is lost.

Serving the policy (``--serve``):
- ``adapter``: one server on the base model with LoRA on; each round's adapter is hot-loaded
  (``/v1/load_lora_adapter``, 0.02 s) and answers as ``round-K``. Every adapter is trained on the
  base model (round K continues round K-1's adapter), so each one loads onto the same server.
  A server given by ``--server-url`` is always used this way.
- ``merged``: the merged weights of the round are served by a fresh server (about 40-60 s to
  start on CPU), stopped while training runs.
- ``auto`` (default): measured once, after SFT: a LoRA-enabled server answers the same requests
  with and without the adapter; if the adapter is more than 1.5x slower (on CPU it was about 8x:
  docs/engineering-notes.md, "vLLM on CPU"), merged; else adapter. The measurement is kept in ``loop.json``.

The package, one module per concern (each imports only those above it in this list, never this file):

    rounds/        the round methods (``--round-method``), one module each, and whether a round can learn
    config.py      LoopConfig: its settings (a --config TOML file's keys, some of them flags) and their checks
    state.py       loop.json: finished stages, resuming, --sft-from
    serving.py     the vLLM server and which model name answers for each round
    summary.py     results read back from the traces: per market, per split, the teacher's ladder row
    curve.py       curve.png
    report.py      results.md: the paired tables, against the teacher, which tool
    stages.py      each stage as a child process, and every command line the loop runs
    run.py         run_loop (the stages in order, resumable) and the ``negotiate loop`` command
"""

from __future__ import annotations

# The names other modules and the tests reach through the package. Each module looks its neighbours' names up in
# their own modules: to stand in for run_stage, patch negotiate.training.loop.stages.run_stage, not this name.
from negotiate.training.loop.config import LORA_RANKS, ROUND_METHODS, SERVE_MODES, LoopConfig, shipped_spec  # noqa: F401
from negotiate.training.loop.curve import write_loop_curve  # noqa: F401
from negotiate.training.loop.report import ALL_SPLITS, results_table, teacher_section, tools_section, write_report  # noqa: F401
from negotiate.training.loop.rounds import ROUNDS, learning_signal  # noqa: F401
from negotiate.training.loop.run import LOOP_NEEDS, run_loop, run_loop_command  # noqa: F401
from negotiate.training.loop.serving import Serving  # noqa: F401
from negotiate.training.loop.stages import FAILED_EPISODES, STOP_GRACE, FailedEpisodes, LoopError, Stages, run_stage  # noqa: F401
from negotiate.training.loop.state import (  # noqa: F401
    BEFORE_FLAGS, EVAL_FIELDS, RESUMABLE_CHANGES, ROUND0_STAGES, SFT_FIELDS, SFT_STAGES, State, take_round0)
from negotiate.training.loop.summary import per_market, summarize_folder, teacher_row  # noqa: F401

__test__ = {"teacher_row": teacher_row}
"""The package's doctests, run where tests/test_doctests.py looks for them (under this package's name)."""

__all__ = ["LoopConfig", "LoopError", "run_loop", "summarize_folder", "results_table"]
