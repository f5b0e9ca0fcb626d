"""``negotiate loop``'s settings: :class:`LoopConfig` (each field is a setting, read by :mod:`negotiate.settings`: a key
of a ``--config`` TOML file and of ``--set``, and a flag where marked; its help is the help of both), and its checks.
Bad values are one line naming the flag (or the file and key) and the problem. The spec files it names by default
(``specs/compact*.toml``) ship with the package: from a folder that has no ``specs/``, they are the package's
(:func:`shipped_spec`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from negotiate.errors import UserError
from negotiate.market import shipped_spec
from negotiate.settings import items_of, setting, spelling
from negotiate.trace import trace_files
from negotiate.training.learning import LearningConfig
from negotiate.training.loop.rounds import ROUNDS

__all__ = ["LORA_RANKS", "ROUND_METHODS", "SERVE_MODES", "LoopConfig", "shipped_spec"]

SERVE_MODES = ("auto", "merged", "adapter")
ROUND_METHODS = tuple(ROUNDS)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256)
"""The ranks vLLM's ``--max-lora-rank`` takes."""
COMPACT = "specs/compact.toml"
HELD_OUT = f"{COMPACT},specs/compact-correlated.toml,specs/compact-shapes.toml"


def _flagged(default, help: str, **options):
    """A setting of ``negotiate loop`` that is also its flag (``--sft-steps`` for ``sft_steps``)."""
    return setting(help, default=default, **options)


def _keyed(default, help: str, **options):
    """A setting of ``negotiate loop`` that is a key only (of ``--config`` and ``--set``)."""
    return setting(help, default=default, key_only=True, **options)


@dataclass
class LoopConfig(LearningConfig):
    """One closed-loop run. Each field is a setting of ``negotiate loop`` (``negotiate.settings``): a key of its
    ``--config`` file and of ``--set``, and a flag where marked so. Those it shares with ``negotiate train`` (and writes
    into each of its training stages) are :class:`~negotiate.training.learning.LearningConfig`'s; where the loop's default
    differs, the field is declared again here, with the reason."""

    out: str = _flagged("runs/loop", "run folder (rerun the same command to resume it)")
    teacher_traces: str | None = _keyed(None, "SFT imitates the sellers of these traces (comma-separated files or folders, copied "
                                            "into the run) instead of --teacher's episodes; --teacher then names the scripted "
                                            "seller the rows are paired against and the held-out states are answered by",
                                      listed=True)
    round_action_weights: str | None = _keyed(None, "rft/dagger rounds: action weights that replace action_weights in the rounds, "
                                                  "e.g. none (every decision weighs 1)", shown="as action_weights")
    split: str = _flagged(COMPACT, "training split or TOML spec (teacher episodes and rollouts)")
    buyers: str = _flagged("threshold", "buyer spec in teacher episodes and rollouts")
    teacher_episodes: int = _keyed(400, "teacher episodes for SFT", kind="int")
    sft_steps: int = _flagged(100, "SFT optimizer steps", kind="int")
    sft_batch: int = _keyed(8, "SFT decisions per step", kind="int")
    sft_lr: float = _keyed(4e-4, "SFT learning rate", kind="number")
    rounds: int = _flagged(2, "rounds after SFT (round 0 is SFT)", kind="int")
    round_method: str = _flagged("rft", f"how a round learns from its rollouts: {', '.join(ROUND_METHODS)} (rft: imitate each group's "
                                     "best episode; dagger: imitate the teacher's reply in every state the policy reached; "
                                     "offline-grpo: the clipped group-relative policy gradient)")
    # The loop's rounds are small (a CPU collects them): fewer markets than online-grpo's prompt dataset.
    markets: int = _keyed(16, "markets collected per round", kind="int")
    # The rollouts explore (evaluations sample at eval_temperature): train's 0.7 is its evaluations' and rollouts' alike.
    temperature: float = _keyed(1.0, "sampling temperature of the rollouts", kind="number")
    grpo_steps: int | None = _keyed(None, "optimizer steps per round", kind="int", shown="round_epochs passes over the round's decisions")
    round_epochs: float = _keyed(1.0, "passes over the round's decisions (where grpo_steps is not given)", kind="number")
    grpo_batch: int = _keyed(16, "decisions per optimizer step in a round", kind="int")
    grpo_lr: float = _keyed(2e-4, "learning rate in a round", kind="number")
    aggregate: bool = _keyed(False, "dagger: learn from the teacher's episodes and every round's rollouts so far (DAgger's "
                                  "aggregated dataset), not only this round's", kind="switch")
    # None: decided once, where the run starts (check()), kept in loop.json and written into every train stage; train
    # itself is off unless set, so that its numbers do not depend on the CPU.
    bf16: bool | None = _keyed(None, "train in bfloat16 autocast", kind="switch", shown="where the CPU has bf16 instructions, "
                             "avx512_bf16 or amx_bf16, or on a GPU: there 2.3x faster per decision than fp32; on an AVX2-only "
                             "CPU 18.6x slower, benchmarks/bench_decisions.py")
    # Its replies are tagged (about 34 tokens); train's 96 leaves room for JSON replies.
    max_tokens: int = _keyed(48, "most tokens per seller reply (the loop's tagged replies take about 34)", kind="int")
    # The compact splits, shipped with the package (shipped_spec): train's default evaluates on its training split.
    eval_splits: str = _flagged(HELD_OUT, "comma-separated held-out splits or TOML specs", listed=True)
    eval_buyers: str = _flagged("threshold", "comma-separated buyer specs; each is a column of held-out evaluations", listed=True)
    eval_episodes: int = _flagged(64, "held-out markets per split", kind="int")
    eval_temperature: float = _keyed(0.7, "sampling temperature in evaluation", kind="number")
    ladder: str = _keyed("greedy,posted,concession,dutch,oracle", "scripted sellers evaluated once on the held-out markets",
                       listed=True)
    rule_tables: str = _keyed("", "lookup tables played beside the fixed rules where the prompt shows two tools: JSON files from "
                                "kinds of state to a tool (benchmarks/hindsight.py writes them from its labels), comma-separated",
                            listed=True)
    untrained: bool = _keyed(True, "evaluate the untrained model too", kind="switch")
    legal: bool = _keyed(False, "decode the policy's replies (rollouts and evaluations) under a regex of the replies the rules "
                              "allow (the seller spec's legal=1)", kind="switch")
    grounded: bool = _keyed(False, "with legal and --prompt facts (or advice): decode each reply's thought as a reason in the "
                                 "planner's words that states the prompt's facts, and its action as the one the reason's "
                                 "verdict names (grounded=1)", kind="switch")
    serve: str = _keyed("auto", f"how a new policy goes into service: {', '.join(SERVE_MODES)}")
    server_url: str | None = _flagged(None, "use this running vLLM server (one started with LoRA enabled, on the base model) "
                                         "instead of starting one")
    port: int | None = _keyed(None, "port of the server this command starts", kind="int", shown="a free one")
    concurrency: int = _keyed(64, "episodes in flight (and requests in flight to the server)", kind="int")
    sft_from: str | None = _flagged(None, "take round 0 (the exported model, teacher episodes, SFT, serving choice, baselines and "
                                       "round 0's evaluation) from this earlier run folder instead of redoing it; every setting "
                                       "round 0 depends on must match that run's")

    def check(self) -> None:
        if self.bf16 is None:  # decided once, on the machine the run starts on, and kept in loop.json
            from negotiate.agents.devices import auto_dtype
            from negotiate.training.server import detect_device

            self.bf16 = auto_dtype(detect_device()) == "bfloat16"
            self.bf16_decided = True  # not a flag: a resumed run (or --sft-from) keeps the run's own decision
        if self.serve not in SERVE_MODES:
            raise UserError(f"choose from {', '.join(SERVE_MODES)}", field=_flag("serve"), value=self.serve)
        if self.round_method not in ROUND_METHODS:
            raise UserError(f"choose from {', '.join(ROUND_METHODS)}", field="--round-method", value=self.round_method)
        method = ROUNDS[self.round_method]
        self.policy.check(server="vllm")  # the prompt view and decoding, checked once, in the spec's words
        if self.round_epochs <= 0:
            raise UserError("must be above 0", field=_flag("round_epochs"), value=self.round_epochs)
        if self.sft_from is not None and not (Path(self.sft_from) / "loop.json").is_file():
            raise UserError("not a loop run folder (no loop.json)", field="--sft-from", value=self.sft_from)
        if self.sft_from is not None and Path(self.sft_from).resolve() == Path(self.out).resolve():
            raise UserError("is the run itself; give an earlier run's folder", field="--sft-from", value=self.sft_from)
        if self.server_url and self.serve == "merged":
            raise UserError("a server given by URL cannot be restarted with merged weights; set serve = adapter or auto",
                            field=_flag("serve"), value=self.serve)
        if self.lora_r not in LORA_RANKS:
            raise UserError(f"vLLM serves LoRA ranks {', '.join(map(str, LORA_RANKS))}", field=_flag("lora_r"), value=self.lora_r)
        for name in ("teacher_episodes", "sft_steps", "sft_batch", "markets", "eval_episodes", "max_tokens", "concurrency", "grpo_batch",
                     "micro_batch"):
            if getattr(self, name) < 1:
                raise UserError("must be at least 1", field=_flag(name), value=getattr(self, name))
        if self.rounds < 0:
            raise UserError("must be 0 or more", field=_flag("rounds"), value=self.rounds)
        from negotiate.agents.registry import parse_agent

        parse_agent(self.teacher, "seller", field_name="--teacher")
        if self.teacher_traces is not None:
            self.teacher_traces = ",".join(str(Path(path).resolve()) for path in _list(self.teacher_traces))  # one spelling, compared on resume
            if not self.teacher_traces:
                raise UserError("give trace files or folders", field=_flag("teacher_traces"), value=self.teacher_traces)
            if not _copied_teacher(Path(self.out)):  # once round 0 holds its copy, the given traces may go
                for path in _list(self.teacher_traces):
                    if not Path(path).exists():
                        raise UserError("no such file or folder", field=_flag("teacher_traces"), value=path)
                if not trace_files(_list(self.teacher_traces)):
                    raise UserError("holds no trace (*.jsonl)", field=_flag("teacher_traces"), value=self.teacher_traces)
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
            raise UserError("give at least one buyer spec (each is a column of held-out evaluations)", field=_flag("eval_buyers"),
                            value=self.eval_buyers)
        for buyers, flag in [(self.buyers, "--buyers"), *((b, "--eval-buyers") for b in _list(self.eval_buyers))]:
            parse_agent(buyers, "buyer", field_name=flag)
        from negotiate.training.dataset import check_teacher, format_action_weights, parse_action_weights

        self.action_weights = format_action_weights(parse_action_weights(self.action_weights, flag=_flag("action_weights")))  # one spelling, compared on resume
        if self.round_action_weights is not None:
            given = self.round_action_weights
            self.round_action_weights = "" if given.strip().lower() == "none" else format_action_weights(
                parse_action_weights(given, flag=_flag("round_action_weights")))
            if self.round_action_weights == self.action_weights:
                self.round_action_weights = None  # the rounds weigh as the SFT: one setting, one spelling
            if self.round_action_weights and not method.weighs_actions:
                raise UserError(f"{method.name} rounds weigh each decision by its advantage only; use "
                                f"{_those(lambda m: m.weighs_actions)} rounds",
                                field=_flag("round_action_weights"), value=given)
        if method.labels_with_teacher:
            check_teacher(self.teacher)
        if self.aggregate and not method.aggregates:
            raise UserError(f"aggregates the teacher's labels: use it with --round-method {_those(lambda m: m.aggregates)}",
                            field=_flag("aggregate"), value=True)
        if self.group < 1:
            raise UserError("must be at least 1", field=_flag("group"), value=self.group)
        if self.group < method.min_group:
            raise UserError(f"a round compares episodes of one market: at least {method.min_group}", field=_flag("group"),
                            value=self.group)
        if self.grpo_steps is not None and self.grpo_steps < 1:
            raise UserError("must be at least 1", field=_flag("grpo_steps"), value=self.grpo_steps)
        if self.seed <= self.eval_seed <= self.seed + self.rounds:
            raise UserError(f"the training runs use seeds {self.seed}..{self.seed + self.rounds}; held-out markets need another",
                            field=_flag("eval_seed"), value=self.eval_seed)
        self.split = shipped_spec(self.split)
        held_out = [shipped_spec(split) for split in _list(self.eval_splits)]
        if held_out != _list(self.eval_splits):  # as given where every file is where it says (a resumed run compares it)
            self.eval_splits = ",".join(held_out)
        for split in [self.split, *held_out]:
            if split.endswith(".toml") and not Path(split).is_file():
                raise UserError("no such spec file", field=_flag("split") if split == self.split else _flag("eval_splits"), value=split)

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
        """The action weights of the rft/dagger rounds: ``round_action_weights`` where given, else ``action_weights``."""
        return self.action_weights if self.round_action_weights is None else self.round_action_weights

    def to_json(self) -> dict:
        return asdict(self)


def _flag(name: str) -> str:
    """How a person gives the setting ``name``: its flag (``--rounds``) where it is one, else its key (``sft_lr``: a line
    of ``--config``'s file, or ``--set sft_lr=...``)."""
    return spelling(LoopConfig, name, "loop")


def _copied_teacher(out: Path) -> bool:
    """Whether the run in ``out`` has finished its teacher stage (with ``--teacher-traces``: copied them in)."""
    try:
        return "round 0 teacher" in json.loads((out / "loop.json").read_text()).get("done", [])
    except (OSError, ValueError):
        return False


def _those(has) -> str:
    """The round methods that ``has`` (a test of a :class:`~negotiate.training.loop.rounds.RoundMethod`), for a message."""
    return " or ".join(method.name for method in ROUNDS.values() if has(method))


def _list(text: str) -> list[str]:
    """The items of a comma-separated loop setting (:func:`~negotiate.settings.items_of`: the one list rule)."""
    return items_of(text)
