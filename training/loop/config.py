"""``negotiate loop``'s settings: :class:`LoopConfig` (each field is a flag; its help text is the flag's help and the
schema of a ``--config`` TOML file), its checks, and reading it from a TOML file and the command line, where a flag
typed overrides the file. Bad values are one line naming the flag (or the file and key) and the problem."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from negotiate.errors import UserError
from negotiate.settings import add_settings, items_of, read_settings, setting, settings_from_args, settings_of
from negotiate.trace import trace_files
from negotiate.training.loop.rounds import ROUNDS

__all__ = ["LORA_RANKS", "ROUND_METHODS", "SERVE_MODES", "LoopConfig", "add_loop_arguments", "loop_config_from_args", "loop_fields",
           "read_loop_config"]

SERVE_MODES = ("auto", "merged", "adapter")
ROUND_METHODS = tuple(ROUNDS)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256)
"""The ranks vLLM's ``--max-lora-rank`` takes."""


@dataclass
class LoopConfig:
    """One closed-loop run. Each field is a setting of ``negotiate loop`` (``negotiate.settings``): a key of its
    ``--config`` file and of ``--set``, and, where marked ``flag=True``, a flag (``--sft-steps`` for ``sft_steps``)."""

    out: str = setting("run folder (rerun the same command to resume it)", default="runs/loop", flag=True)
    model: str = setting("the starting model: a transformers folder, a .gguf file, or smollm2", default="smollm2", flag=True)
    teacher: str = setting("the scripted seller SFT imitates", default="greedy", flag=True)
    teacher_traces: str | None = setting("SFT imitates the sellers of these traces (comma-separated files or folders, copied into the "
                                       "run) instead of --teacher's episodes; --teacher then names the scripted seller the rows "
                                       "are paired against and the held-out states are answered by", default=None)
    action_weights: str = setting("SFT and rft/dagger rounds: weigh each imitated decision's loss by the kind of its action, e.g. "
                                "accept=4 (kinds not named weigh 1)", default="")
    round_action_weights: str | None = setting("rft/dagger rounds: action weights that replace --action-weights in the "
                                             "rounds, e.g. none (every decision weighs 1) (default: as --action-weights)",
                                             default=None)
    split: str = setting("training split or TOML spec (teacher episodes and rollouts)", default="specs/compact.toml", flag=True)
    buyers: str = setting("buyer spec in teacher episodes and rollouts", default="threshold", flag=True)
    seed: int = setting("run seed of the teacher's markets; round K collects on seed + K", default=0)
    teacher_episodes: int = setting("teacher episodes for SFT", default=400)
    sft_steps: int = setting("SFT optimizer steps", default=100, flag=True)
    sft_batch: int = setting("SFT decisions per step", default=8)
    sft_lr: float = setting("SFT learning rate", default=4e-4)
    rounds: int = setting("rounds after SFT (round 0 is SFT)", default=2, flag=True)
    round_method: str = setting(f"how a round learns from its rollouts: {', '.join(ROUND_METHODS)} (rft: imitate each group's best "
                              "episode; dagger: imitate the teacher's reply in every state the policy reached; offline-grpo: "
                              "the clipped group-relative policy gradient)", default="rft", flag=True)
    markets: int = setting("markets collected per round", default=16)
    group: int = setting("episodes per market per round (the group its episodes are compared in)", default=4)
    temperature: float = setting("sampling temperature of the rollouts", default=1.0)
    grpo_steps: int | None = setting("optimizer steps per round (default: --round-epochs passes over the round's decisions)", default=None)
    round_epochs: float = setting("passes over the round's decisions (when --grpo-steps is not given)", default=1.0)
    grpo_batch: int = setting("decisions per optimizer step in a round", default=16)
    grpo_lr: float = setting("learning rate in a round", default=2e-4)
    kl_beta: float = setting("offline-grpo: weight of the KL to the base model", default=0.0)
    aggregate: bool = setting("dagger: learn from the teacher's episodes and every round's rollouts so far (DAgger's aggregated "
                            "dataset), not only this round's", default=False)
    lora_r: int = setting(f"LoRA rank, one of {', '.join(map(str, LORA_RANKS))}", default=16)
    bf16: bool | None = setting("train in bfloat16 autocast (default: where the CPU has bf16 instructions, avx512_bf16 or amx_bf16, "
                              "or on a GPU: there 2.3x faster per decision than fp32; on an AVX2-only CPU 18.6x slower, "
                              "benchmarks/bench_decisions.py)", default=None)
    micro_batch: int = setting("decisions per training forward pass (they share one pass over their common prompt prefix)", default=8)
    max_tokens: int = setting("most tokens per seller reply (the loop's tagged replies take about 34; train's default, 96, "
                              "leaves room for JSON replies)", default=48)
    eval_splits: str = setting("comma-separated held-out splits or TOML specs",
                             default="specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml", flag=True)
    eval_buyers: str = setting("comma-separated buyer specs; each is a column of held-out evaluations", default="threshold", flag=True)
    eval_episodes: int = setting("held-out markets per split", default=64, flag=True)
    eval_seed: int = setting("run seed of the held-out markets (no training run may use it)", default=1_000_003)
    eval_temperature: float = setting("sampling temperature in evaluation", default=0.7)
    ladder: str = setting("scripted sellers evaluated once on the held-out markets", default="greedy,posted,concession,dutch,oracle")
    rule_tables: str = setting("lookup tables played beside the fixed rules where the prompt shows two tools: JSON files from kinds "
                               "of state to a tool (benchmarks/hindsight.py writes them from its labels), comma-separated",
                               default="")
    untrained: bool = setting("evaluate the untrained model too", default=True)
    legal: bool = setting("decode the policy's replies (rollouts and evaluations) under a regex of the replies the rules allow "
                        "(the seller spec's legal=1)", default=False)
    grounded: bool = setting("with --legal and --prompt facts (or advice): decode each reply's thought as a reason in the planner's words that "
                           "states the prompt's facts, and its action as the one the reason's verdict names (grounded=1)",
                           default=False)
    fresh: bool = setting("ask every seller (the teacher, the policy, the ladder) for a message only once every scripted buyer has "
                        "answered it, so the policy decides on the state its message lands in, as the teacher did (eval --fresh)",
                        default=False)
    prompt: str = setting("the policy's prompt: full; compact (each buyer's thread of actions without talk, under half the "
                        "tokens); facts (compact, with the turns each buyer has and each bidder's last bids and trend); advice "
                        "(facts, and the message the planner would send); or tools (advice, and greedy's message). "
                        "SFT renders the teacher's decisions with it, and the policy is served with it", default="full", flag=True)
    serve: str = setting(f"how a new policy goes into service: {', '.join(SERVE_MODES)}", default="auto")
    server_url: str | None = setting("use this running vLLM server (started with --enable-lora on the base model) instead of starting one",
                                   default=None, flag=True)
    port: int | None = setting("port of the server this command starts (default: a free one)", default=None)
    concurrency: int = setting("episodes in flight (and requests in flight to the server)", default=64)
    threads: int | None = setting("torch threads in training (default: torch's choice)", default=None)
    sft_from: str | None = setting("take round 0 (the exported model, teacher episodes, SFT, serving choice, baselines and round 0's "
                                 "evaluation) from this earlier run folder instead of redoing it; every flag round 0 depends on "
                                 "must match that run's", default=None, flag=True)

    def check(self) -> None:
        if self.bf16 is None:  # decided once, on the machine the run starts on, and kept in loop.json
            from negotiate.agents.local import auto_dtype
            from negotiate.training.server import detect_device

            self.bf16 = auto_dtype(detect_device()) == "bfloat16"
            self.bf16_decided = True  # not a flag: a resumed run (or --sft-from) keeps the run's own decision
        if self.serve not in SERVE_MODES:
            raise UserError(f"choose from {', '.join(SERVE_MODES)}", field="--serve", value=self.serve)
        if self.round_method not in ROUND_METHODS:
            raise UserError(f"choose from {', '.join(ROUND_METHODS)}", field="--round-method", value=self.round_method)
        method = ROUNDS[self.round_method]
        self.policy.check(server="vllm")  # the prompt view and decoding, checked once, in the spec's words
        if self.round_epochs <= 0:
            raise UserError("must be above 0", field="--round-epochs", value=self.round_epochs)
        if self.sft_from is not None and not (Path(self.sft_from) / "loop.json").is_file():
            raise UserError("not a loop run folder (no loop.json)", field="--sft-from", value=self.sft_from)
        if self.sft_from is not None and Path(self.sft_from).resolve() == Path(self.out).resolve():
            raise UserError("is the run itself; give an earlier run's folder", field="--sft-from", value=self.sft_from)
        if self.server_url and self.serve == "merged":
            raise UserError("a server given by URL cannot be restarted with merged weights; use --serve adapter or auto",
                            field="--serve", value=self.serve)
        if self.lora_r not in LORA_RANKS:
            raise UserError(f"vLLM serves LoRA ranks {', '.join(map(str, LORA_RANKS))}", field="--lora-r", value=self.lora_r)
        for name in ("teacher_episodes", "sft_steps", "sft_batch", "markets", "eval_episodes", "max_tokens", "concurrency", "grpo_batch",
                     "micro_batch"):
            if getattr(self, name) < 1:
                raise UserError("must be at least 1", field=_flag(name), value=getattr(self, name))
        if self.rounds < 0:
            raise UserError("must be 0 or more", field="--rounds", value=self.rounds)
        from negotiate.agents.registry import parse_agent

        parse_agent(self.teacher, "seller", field_name="--teacher")
        if self.teacher_traces is not None:
            self.teacher_traces = ",".join(str(Path(path).resolve()) for path in _list(self.teacher_traces))  # one spelling, compared on resume
            if not self.teacher_traces:
                raise UserError("give trace files or folders", field="--teacher-traces", value=self.teacher_traces)
            if not _copied_teacher(Path(self.out)):  # once round 0 holds its copy, the given traces may go
                for path in _list(self.teacher_traces):
                    if not Path(path).exists():
                        raise UserError("no such file or folder", field="--teacher-traces", value=path)
                if not trace_files(_list(self.teacher_traces)):
                    raise UserError("holds no trace (*.jsonl)", field="--teacher-traces", value=self.teacher_traces)
            if method.labels_with_teacher:
                raise UserError(f"{method.name} rounds label the policy's states with --teacher, not with the traces' seller; use "
                                f"{_those(lambda m: not m.labels_with_teacher)} rounds", field="--round-method", value=self.round_method)
        if self.rule_tables:
            from negotiate.agents.rule import table_rule
            from negotiate.agents.views import view

            self.rule_tables = ",".join(str(Path(path).resolve()) for path in _list(self.rule_tables))
            tools = view(self.prompt).tools
            if len(tools) != 2:
                raise UserError(f"a table chooses between two tools, and --prompt {self.prompt} shows {len(tools)}",
                                field="rule_tables", value=self.rule_tables)
            for path in _list(self.rule_tables):
                parse_agent(table_rule(tools, path), "seller", field_name="rule_tables")
        if not _list(self.eval_buyers):
            raise UserError("give at least one buyer spec (each is a column of held-out evaluations)", field="--eval-buyers",
                            value=self.eval_buyers)
        for buyers, flag in [(self.buyers, "--buyers"), *((b, "--eval-buyers") for b in _list(self.eval_buyers))]:
            parse_agent(buyers, "buyer", field_name=flag)
        from negotiate.training.dataset import check_teacher, format_action_weights, parse_action_weights

        self.action_weights = format_action_weights(parse_action_weights(self.action_weights))  # one spelling, compared on resume
        if self.round_action_weights is not None:
            given = self.round_action_weights
            self.round_action_weights = "" if given.strip().lower() == "none" else format_action_weights(
                parse_action_weights(given, flag="--round-action-weights"))
            if self.round_action_weights == self.action_weights:
                self.round_action_weights = None  # the rounds weigh as the SFT: one setting, one spelling
            if self.round_action_weights and not method.weighs_actions:
                raise UserError(f"{method.name} rounds weigh each decision by its advantage only; use "
                                f"{_those(lambda m: m.weighs_actions)} rounds",
                                field="--round-action-weights", value=given)
        if method.labels_with_teacher:
            check_teacher(self.teacher)
        if self.aggregate and not method.aggregates:
            raise UserError(f"aggregates the teacher's labels: use it with --round-method {_those(lambda m: m.aggregates)}",
                            field="--aggregate", value=True)
        if self.group < 1:
            raise UserError("must be at least 1", field="--group", value=self.group)
        if self.group < method.min_group:
            raise UserError(f"a round compares episodes of one market: at least {method.min_group}", field="--group", value=self.group)
        if self.grpo_steps is not None and self.grpo_steps < 1:
            raise UserError("must be at least 1", field="--grpo-steps", value=self.grpo_steps)
        if self.seed <= self.eval_seed <= self.seed + self.rounds:
            raise UserError(f"the training runs use seeds {self.seed}..{self.seed + self.rounds}; held-out markets need another",
                            field="--eval-seed", value=self.eval_seed)
        for split in [self.split, *_list(self.eval_splits)]:
            if split.endswith(".toml") and not Path(split).is_file():
                raise UserError("no such spec file", field="--split" if split == self.split else "--eval-splits", value=split)

    @property
    def policy(self):
        """The policy the loop trains, serves and evaluates (``negotiate.agents.policy``): its prompt view, tagged replies,
        ``legal`` and ``grounded`` decoding, the rollouts' temperature and the token budget (evaluations replace the
        temperature with ``eval_temperature``)."""
        from negotiate.agents.policy import Policy

        return Policy(prompt=self.prompt, format="tagged", legal=self.legal, grounded=self.grounded, temperature=self.temperature,
                      max_tokens=self.max_tokens)

    @property
    def round_weights(self) -> str:
        """The action weights of the rft/dagger rounds: ``--round-action-weights`` where given, else ``--action-weights``."""
        return self.action_weights if self.round_action_weights is None else self.round_action_weights

    def to_json(self) -> dict:
        return asdict(self)


def loop_fields():
    return [(s.name, s.kind, s.default, s.help) for s in settings_of(LoopConfig)]


def _flag(name: str) -> str:
    """How a person gives the setting ``name``: its flag (``--rounds``) where it is one, else its key (``sft_lr``: a line
    of ``--config``'s file, or ``--set sft_lr=...``)."""
    flags = {s.name for s in settings_of(LoopConfig) if s.flag}
    return "--" + name.replace("_", "-") if name in flags else name


def _copied_teacher(out: Path) -> bool:
    """Whether the run in ``out`` has finished its teacher stage (with ``--teacher-traces``: copied them in)."""
    try:
        return "round 0 teacher" in json.loads((out / "loop.json").read_text()).get("done", [])
    except (OSError, ValueError):
        return False


def _those(has) -> str:
    """The round methods that ``has`` (a test of a :class:`~negotiate.training.loop.rounds.RoundMethod`), for a message."""
    return " or ".join(method.name for method in ROUNDS.values() if has(method))


def add_loop_arguments(parser) -> None:
    add_settings(parser, LoopConfig, command="loop")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None,
                        help="least severe log line shown on the console (default: warning; OUT/loop.log.jsonl gets every line)")
    parser.add_argument("--quiet", action="store_true", help="only errors on the console")


def read_loop_config(path: str | Path) -> dict:
    """The loop settings in a TOML file (``teacher_episodes = 600`` or ``teacher-episodes = 600``), checked against
    :class:`LoopConfig`'s fields: a one-line :class:`UserError` naming the file, the key and the value otherwise.

    Relative paths in it (``out``, ``split``, ``eval_splits``, ``model``, ``sft_from``) are relative to where the
    command runs, as they are on the command line, not to the file."""
    return read_settings(path, LoopConfig, command="loop")


def loop_config_from_args(args) -> LoopConfig:
    """The run's settings, checked: each field's default, replaced by ``--config``'s value, by ``--set``'s, by the flag
    typed on the command line."""
    return settings_from_args(LoopConfig, args, command="loop")


_list = items_of
"""The items of a comma-separated loop setting (the name the loop's modules import)."""
