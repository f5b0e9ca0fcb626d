"""``negotiate teach``: a menu seller taught by replaying the market, round after round, measured on held-out markets.

The recipe (issue 49), each stage written under ``--out``:

1. **Imitate the planner on the menu.** The planner's menu rule (``menu``: the planner's moves on the menu's price
   grid) plays the training markets; each of its decisions is a menu prompt and the planner's letter. The policy (a
   ``tiny`` model trained from scratch, or a pretrained one with LoRA) learns to pick it (cross-entropy).
2. **Replay rounds.** The policy plays fresh training markets, sampling its letters (``explore`` temperature); the
   teacher (``negotiate.training.teacher``) replays every option of every state it visited, then a continuation seller
   (by buyer kind: the best fixed rule over the tools), and the policy is trained on every round's states so far:
   cross-entropy toward the best option weighted by regret, a policy-gradient step over the options with the replayed
   values as advantages, kept near the playing policy by a KL term.
3. **Held-out evaluation after each stage**, greedy (temperature 0), on markets of the run seed ``eval_seed`` that no
   training stage plays, against conceding and threshold buyers; every baseline (``baselines``: scripted sellers that
   need no learning) plays the same markets, and the table pairs each stage with each of them.

The replays read the buyers' values and strategies (training-time privilege); the policy reads its prompt alone, and
the evaluation plays markets no replay saw. ``results.md`` and ``results.json`` hold the table, ``curve.png`` the
profit/OPT of each stage per buyer kind with the baselines, ``policy/`` the kept stage's model (``keep``: the best on the eval markets, or the last) (``hf:OUT/policy?prompt=menu``
plays it; ``learned`` is one such folder shipped in the package).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from negotiate.errors import UserError
from negotiate.settings import setting

__all__ = ["TeachConfig", "teach", "keep_stage", "COMPACT", "OBJECTIVES", "KEEP"]

OBJECTIVES = ("regret-pg", "values")
KEEP = ("best", "last")
"""Which stage ``policy/`` holds (:func:`keep_stage`)."""
"""The replay rounds' losses (``negotiate.training.menu_model``: ``replay_loss``, ``value_loss``)."""

COMPACT = ("specs/compact.toml", "specs/compact-correlated.toml", "specs/compact-shapes.toml")
"""The compact splits the studies train and evaluate on (2-4 buyers, 2-3 products)."""
BASELINES = ("planner", "greedy", "menu", "rule?tools=greedy|planner?reasons=1&accept=planner", "menu?pick=up6")
"""Scripted sellers every stage is paired with: the planner, greedy, the planner on the menu's grid, the best fixed rule
over the tools against conceding buyers (docs/experiments/rule-baselines.md) and the best fixed rule over the menu's
options on the training seed (the planner's offer six grid steps up)."""


def _flag(default, help: str, **options):
    """A setting of ``negotiate teach`` that is also its flag."""
    return setting(help, default=default, **options)


def _key(default, help: str, **options):
    """A setting of ``negotiate teach`` that is a key only (of ``--config`` and ``--set``)."""
    return setting(help, default=default, key_only=True, **options)


@dataclass
class TeachConfig:
    """One ``negotiate teach`` run. Each field is a setting (``--config`` file key, ``--set``); those marked are flags."""

    out: str = _flag("runs/teach", "folder for the policy, its data, traces and results")
    model: str = _flag("tiny", "tiny (a small transformer trained from scratch, its tokenizer trained on the menu prompts) or a "
                               "model hf: loads (smollm2, a folder), taught through a LoRA adapter")
    hidden: int = _key(128, "tiny: hidden size", kind="int")
    layers: int = _key(4, "tiny: transformer layers", kind="int")
    heads: int = _key(4, "tiny: attention heads", kind="int")
    vocab: int = _key(512, "tiny: tokenizer vocabulary", kind="int")
    lora_r: int = _key(8, "pretrained model: LoRA rank", kind="int")
    buyers: tuple[str, ...] = _key(("concession", "threshold"), "buyer kinds the policy is taught and evaluated against, each on its "
                                                                "own markets", kind="list")
    splits: tuple[str, ...] = _key(COMPACT, "market specs of the training and evaluation markets", kind="list")
    seed: int = _flag(7, "run seed of the training markets", kind="int")
    teacher: str = _key("menu", "the seller whose menu choices the policy imitates first: menu (the planner's option on the "
                                "menu) or another seller that picks menu options, such as rollout?worlds=8&buyers=mixed (no "
                                "private information: it plans on worlds drawn from the spec's prior)")
    sft_markets: int = _key(300, "markets per split and buyer kind the planner's menu rule plays for imitation", kind="int")
    sft_epochs: float = _key(3.0, "passes over the imitation decisions", kind="number")
    rounds: int = _flag(3, "replay rounds after imitation", kind="int")
    round_markets: int = _key(150, "fresh training markets per split and buyer kind the policy plays each round", kind="int")
    round_epochs: float = _key(2.0, "passes over every round's labelled decisions so far, each round", kind="number")
    explore: float = _key(1.0, "sampling temperature of the policy in the rounds' plays", kind="number")
    lr: float = _flag(1e-3, "AdamW learning rate", kind="number")
    batch_size: int = _key(32, "decisions per optimizer step", kind="int")
    objective: str = _key("regret-pg", "replay rounds' loss: regret-pg (cross-entropy toward the best options weighted by regret, "
                                        "a policy-gradient step over every option, a KL to the playing policy) or values (the "
                                        "letters' logits regress each option's replayed value; the policy is their argmax)",
                          choices=OBJECTIVES)
    start: str | None = _key(None, "a menu policy folder to start the rounds from instead of imitating the planner", kind="path",
                             shown="none: imitate the planner")
    regret_floor: float = _key(0.005, "replay loss: weight of a state whose chosen option was the best", kind="number")
    ce: float = _key(1.0, "replay loss (regret-pg): weight of the cross-entropy toward the best options", kind="number")
    pg: float = _key(10.0, "replay loss: weight of the policy-gradient term", kind="number")
    kl: float = _key(0.5, "replay loss: weight of the KL to the playing policy", kind="number")
    eval_seed: int = _flag(1_000_003, "run seed of the held-out markets (no training stage plays them)", kind="int")
    eval_markets: int = _flag(200, "held-out markets per split and buyer kind", kind="int")
    baselines: tuple[str, ...] = _key(BASELINES, "scripted sellers played on the held-out markets beside each stage", kind="list")
    threads: int | None = _flag(None, "torch threads", kind="int", shown="torch's choice")
    play_batch: int = _key(64, "policy decisions read in one forward pass when it plays", kind="int")
    keep: str = _key("best", "which stage policy/ holds: best (the highest eval-market profit/OPT, averaged over the buyer kinds; "
                             "eval_seed's markets choose it, so report the result on other run seeds) or last", choices=KEEP)

    def check(self) -> None:
        for name in ("sft_markets", "eval_markets", "batch_size", "play_batch", "hidden", "layers", "heads"):
            if getattr(self, name) < 1:
                raise UserError("must be at least 1", field=name, value=getattr(self, name))
        if self.rounds < 0 or self.round_markets < 1:
            raise UserError("rounds must be 0 or more and round_markets at least 1", field="rounds", value=self.rounds)
        if self.eval_seed == self.seed:
            raise UserError("is the training markets' run seed; held-out markets need their own", field="eval_seed", value=self.eval_seed)
        if self.keep not in KEEP:
            raise UserError(f"choose from {', '.join(KEEP)}", field="keep", value=self.keep)
        if self.objective not in OBJECTIVES:
            raise UserError(f"choose from {', '.join(OBJECTIVES)}", field="objective", value=self.objective)
        if self.start is not None and not (Path(self.start) / "config.json").is_file():
            raise UserError("is not a policy folder (no config.json)", field="start", value=self.start)
        if not self.buyers or not self.splits:
            raise UserError("give at least one buyer kind and one split", field="buyers", value=list(self.buyers))
        from negotiate.agents.registry import parse_agent
        from negotiate.market import resolve_spec

        from negotiate.training.loop.config import shipped_spec

        for split in self.splits:
            resolve_spec(shipped_spec(split), "splits")
        for buyers in self.buyers:
            parse_agent(buyers, "buyer", field_name="buyers")
        for seller in self.baselines:
            parse_agent(seller, "seller", field_name="baselines")
        parse_agent(self.teacher, "seller", field_name="teacher")

    def to_json(self) -> dict:
        return {key: str(value) if isinstance(value, Path) else value for key, value in asdict(self).items()}


# -- playing ------------------------------------------------------------------------------------------------


class _Weights:
    """The model being taught as a seller spec a run builds episodes with: the menu seller on an in-memory backend."""

    def __init__(self, model, tokenizer, temperature: float, batch: int, label: str):
        from negotiate.agents.hf import HFBackend, HFOptions, _LocalModel
        from negotiate.agents.policy import Policy

        local = _LocalModel.in_memory(model, tokenizer, label)
        local.batch = batch
        self.backend = HFBackend(HFOptions(model=label, path=label, temperature=temperature, batch=batch, prompt="menu"), model=local)
        self.policy = Policy(prompt="menu", temperature=temperature)
        self.text = label

    def build(self, market, seed, pools=None):
        from negotiate.agents.registry import policy_seller

        return policy_seller(self.policy, self.backend, market, seed)


def _play(seller, buyers: str, split: str, seed: int, indices: range) -> list:
    """The episodes ``seller`` (a spec text, or :class:`_Weights`) plays on markets ``indices`` of a ``--fresh`` run."""
    from negotiate.agents.registry import parse_agent
    from negotiate.metrics import opt
    from negotiate.run import LOCAL_TIMEOUT, Run, RunConfig
    from negotiate.training.loop.config import shipped_spec

    spec = parse_agent(seller, "seller") if isinstance(seller, str) else seller
    run = Run(RunConfig(sellers=(spec.text,), buyers=buyers, split=shipped_spec(split), seed=seed, fresh=True, seller_timeout=LOCAL_TIMEOUT,
                        reply_timeout=LOCAL_TIMEOUT))

    async def main() -> list:
        async with run:
            plans = [run.episode(spec, i) for i in indices]
            return await asyncio.gather(*(plan.play(opt_value=opt(plan.market)) for plan in plans))

    episodes = asyncio.run(main())
    failed = [e for e in episodes if e.failed]
    if failed:  # a result from incomplete data is not a result
        raise RuntimeError(f"{len(failed)} of {len(episodes)} episodes of {spec.text} failed; the first: {failed[0].reason}")
    return episodes


def _ratio(episode) -> float:
    value = episode.metrics.get("profit_ratio")
    return 0.0 if value is None else float(value)


# -- the recipe ---------------------------------------------------------------------------------------------


class _Log:
    """Lines to the console and to ``OUT/teach.log``, each with the seconds since the start."""

    def __init__(self, path: Path, say):
        self.path, self.say, self.began = path, say, time.perf_counter()

    def __call__(self, text: str) -> None:
        line = f"[{time.perf_counter() - self.began:7.0f} s] {text}"
        self.say(line)
        with open(self.path, "a") as file:
            file.write(line + "\n")


def teach(config: TeachConfig, *, say=print) -> dict:
    """Run the recipe (module docstring); returns the results (also in ``OUT/results.json``)."""
    import torch

    from negotiate.training.menu_model import (MenuExample, build_tiny, encode, fit, letter_ids, load_model, replay_loss,
                                               save_model, sft_loss, value_loss)
    from negotiate.training.teacher import label_episode

    if config.threads:
        torch.set_num_threads(config.threads)
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' bars when a model is saved: the log is ours
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_json(), indent=1) + "\n")
    log = _Log(out / "teach.log", say)
    began = time.perf_counter()
    stages: dict[str, float] = {}

    results = {"config": config.to_json(), "stages": {}, "baselines": {}}
    made_by = _provenance()  # the tree as the run starts: what it ran

    def tick(name):
        def progress(step, total, row):
            if step == total or step % 200 == 0:
                log(f"{name}: step {step}/{total}, loss {row['loss']:.4f}, " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()
                                                                                      if k not in ("step", "loss")))
        return progress

    if config.start is not None:  # the rounds start from a policy taught before
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tokenizer = AutoModelForCausalLM.from_pretrained(config.start), AutoTokenizer.from_pretrained(config.start)
        letters, pad = letter_ids(tokenizer), tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        log(f"model: {config.start}, {sum(p.numel() for p in model.parameters()):,} parameters")
        results["stages"]["start"] = _evaluate(config, model, tokenizer, out / "stage-00-start", log)
    else:
        # 1. The planner's decisions on the menu, for imitation.
        sft_labels = []
        for buyers in config.buyers:
            for split in config.splits:
                for episode in _play(config.teacher, buyers, split, config.seed, range(config.sft_markets)):
                    sft_labels += label_episode(episode, value=False)
        log(f"imitation data: {len(sft_labels)} {config.teacher} decisions on {config.sft_markets * len(config.splits) * len(config.buyers)} markets")
        if config.model == "tiny":
            corpus = [m["content"] for label in sft_labels[:4000] for m in label.prompt]
            model, tokenizer = build_tiny(corpus, hidden=config.hidden, layers=config.layers, heads=config.heads, vocab=config.vocab,
                                          seed=config.seed)
        else:
            model, tokenizer = load_model(config.model, lora=True, lora_r=config.lora_r, lora_alpha=2 * config.lora_r)
        letters, pad = letter_ids(tokenizer), tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        parameters = sum(p.numel() for p in model.parameters())
        log(f"model: {config.model}, {parameters:,} parameters ({sum(p.numel() for p in model.parameters() if p.requires_grad):,} trained)")
        # the planner's option on its own menu; another teacher's, the option its message is
        targets = [label.planner if config.teacher == "menu" else label.chosen for label in sft_labels]
        sft = [MenuExample(encode(tokenizer, label.prompt), len(label.options), target=target)
               for label, target in zip(sft_labels, targets) if target is not None]
        stages["data"] = time.perf_counter() - began

        t = time.perf_counter()
        fit(model, sft, sft_loss, letters=letters, pad=pad, epochs=config.sft_epochs, lr=config.lr, batch_size=config.batch_size,
            seed=config.seed, progress=tick("imitation"))
        stages["imitation"] = time.perf_counter() - t
        evaluated = _evaluate(config, model, tokenizer, out / "stage-00-sft", log)
        results["stages"]["sft"] = evaluated
        save_model(model, tokenizer, out / "stage-00-sft" / "policy")

    # 2. Replay rounds on the policy's own states.
    replayed = []
    for r in range(1, config.rounds + 1):
        t = time.perf_counter()
        weights = _Weights(model, tokenizer, config.explore, config.play_batch, f"round-{r}")
        start = config.sft_markets + (r - 1) * config.round_markets
        labels = []
        for buyers in config.buyers:
            for split in config.splits:
                for episode in _play(weights, buyers, split, config.seed, range(start, start + config.round_markets)):
                    labels += label_episode(episode)
        replayed += labels
        (out / f"round-{r:02d}").mkdir(exist_ok=True)
        with open(out / f"round-{r:02d}" / "labels.jsonl", "w") as file:
            file.writelines(json.dumps(lab.to_json()) + "\n" for lab in labels)
        gap = [max(v for v in lab.values if v is not None) - lab.values[lab.chosen] for lab in labels if lab.chosen is not None]
        log(f"round {r}: {len(labels)} decisions replayed; the chosen option's mean regret {sum(gap) / max(1, len(gap)):.4f}")
        examples = [MenuExample(encode(tokenizer, lab.prompt), len(lab.options), values=lab.values, chosen=lab.chosen, old=lab.probs)
                    for lab in replayed]
        if config.objective == "values":
            loss = lambda logits, batch: value_loss(logits, batch)
        else:
            loss = lambda logp, batch: replay_loss(logp, batch, regret_floor=config.regret_floor, ce_weight=config.ce, pg=config.pg,
                                                   kl=config.kl)
        fit(model, examples, loss, letters=letters, pad=pad, epochs=config.round_epochs, lr=config.lr, batch_size=config.batch_size,
            seed=config.seed + r, progress=tick(f"round {r}"), raw=config.objective == "values")
        stages[f"round-{r}"] = time.perf_counter() - t
        folder = out / f"stage-{r:02d}-round"
        results["stages"][f"round-{r}"] = _evaluate(config, model, tokenizer, folder, log)
        save_model(model, tokenizer, folder / "policy")
    kept = keep_stage(results["stages"], config.keep)
    results["kept"] = kept
    if kept == list(results["stages"])[-1]:
        save_model(model, tokenizer, out / "policy")
    else:
        shutil.copytree(out / _stage_folder(list(results["stages"]).index(kept), kept) / "policy", out / "policy", dirs_exist_ok=True)
    log(f"policy/: the policy after {kept} ({config.keep})")

    # 3. The baselines on the same held-out markets.
    t = time.perf_counter()
    for seller in config.baselines:
        results["baselines"][seller] = {buyers: {split: [_ratio(e) for e in _play(seller, buyers, split, config.eval_seed,
                                                                                  range(config.eval_markets))]
                                                 for split in config.splits} for buyers in config.buyers}
    stages["baselines"] = time.perf_counter() - t
    results["parameters"] = sum(p.numel() for p in model.parameters())
    results["seconds"] = {name: round(value, 1) for name, value in stages.items()} | {"all": round(time.perf_counter() - began, 1)}
    results["made_by"] = made_by | {"load": _provenance()["load"]}  # the commit as it started, the load as it ends
    (out / "results.json").write_text(json.dumps(results) + "\n")
    (out / "results.md").write_text(results_table(results))
    _curve(results, out / "curve.png")
    log(f"done: {out / 'results.md'}")
    return results


def keep_stage(stages: dict, keep: str) -> str:
    """The stage ``policy/`` holds: the last, or the best by eval-market profit/OPT averaged over the buyer kinds (the
    first of equals).

    >>> stages = {"sft": {"ratios": {"a": {"s": [0.5]}, "b": {"s": [0.7]}}},
    ...           "round-1": {"ratios": {"a": {"s": [0.6]}, "b": {"s": [0.7]}}},
    ...           "round-2": {"ratios": {"a": {"s": [0.7]}, "b": {"s": [0.5]}}}}
    >>> keep_stage(stages, "best"), keep_stage(stages, "last")
    ('round-1', 'round-2')
    """
    names = list(stages)
    if keep == "last":
        return names[-1]

    def score(name):
        kinds = stages[name]["ratios"].values()
        return sum(sum(r for split in kind.values() for r in split) / sum(len(split) for split in kind.values())
                   for kind in kinds) / len(kinds)
    return max(names, key=score)


def _stage_folder(index: int, name: str) -> str:
    return f"stage-{index:02d}-{'round' if name.startswith('round') else name}"


def _evaluate(config: TeachConfig, model, tokenizer, folder: Path, log) -> dict:
    """The policy, greedy, on the held-out markets: profit/OPT per buyer kind and split, in market order; traces kept."""
    from negotiate.trace import TraceWriter

    t = time.perf_counter()
    weights = _Weights(model, tokenizer, 0.0, config.play_batch, folder.name)
    ratios: dict = {}
    folder.mkdir(parents=True, exist_ok=True)
    valid = sent = 0
    for buyers in config.buyers:
        ratios[buyers] = {}
        with TraceWriter(folder / f"eval-{buyers}.jsonl") as writer:
            for split in config.splits:
                episodes = _play(weights, buyers, split, config.eval_seed, range(config.eval_markets))
                for episode in episodes:
                    writer.write(episode.events)
                    sent += episode.metrics.get("seller_messages", 0)
                    valid += episode.metrics.get("seller_messages", 0) - episode.metrics.get("seller_invalid", 0)
                ratios[buyers][split] = [_ratio(e) for e in episodes]
    means = {b: sum(sum(v) for v in s.values()) / sum(len(v) for v in s.values()) for b, s in ratios.items()}
    log(f"{folder.name}: eval-market profit/OPT " + ", ".join(f"{b} {m:.3f}" for b, m in means.items()) +
        f"; valid {valid / max(1, sent):.4f} ({time.perf_counter() - t:.0f} s)")
    return {"ratios": ratios, "valid": valid / max(1, sent), "messages": sent}


# -- results ------------------------------------------------------------------------------------------------


def _pooled(by_split: dict) -> list[float]:
    return [x for split in sorted(by_split) for x in by_split[split]]


def _ci(values: list[float]) -> tuple[float, float]:
    from negotiate.metrics import mean_ci

    return mean_ci(values)


def results_table(results: dict) -> str:
    """``results.md``: per buyer kind, each stage and baseline's held-out profit/OPT, and the paired differences the
    recipe's targets are stated in."""
    config = results["config"]
    lines = ["# negotiate teach: results", "",
             f"Eval markets (no training stage plays them; they choose the kept stage): run seed {config['eval_seed']}, {config['eval_markets']} per split "
             f"({', '.join(config['splits'])}); training markets: run seed {config['seed']}. Profit/OPT, mean ± 95% CI; "
             "differences are paired on the same markets.", ""]
    made = results.get("made_by", {})
    if made:
        lines += [f"Made by commit {made.get('commit')} on {made.get('cores')} cores ({made.get('machine')}); "
                  f"5-minute load at the end {made.get('load')}; wall time {results['seconds']['all']:.0f} s "
                  f"({', '.join(f'{k} {v:.0f} s' for k, v in results['seconds'].items() if k != 'all')}).", ""]
    stages = list(results["stages"])
    for buyers in config["buyers"]:
        lines += [f"## {buyers} buyers", "", "| seller | profit/OPT | − planner | − best baseline | − first stage |", "|---|---|---|---|---|"]
        table = {f"policy after {name}": _pooled(results["stages"][name]["ratios"][buyers]) for name in stages}
        base = {seller: _pooled(by[buyers]) for seller, by in results["baselines"].items()}
        best_name = max(base, key=lambda s: sum(base[s]) / len(base[s])) if base else None
        sft = table.get(f"policy after {stages[0]}")
        for name, values in {**table, **base}.items():
            row = [name, "%.3f ± %.3f" % _ci(values)]
            for other in (base.get("planner"), base.get(best_name), sft):
                row.append("" if other is None or other is values else "%+.3f ± %.3f" % _ci([a - b for a, b in zip(values, other)]))
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", f"Best baseline: `{best_name}`. n = {len(next(iter(table.values())))} markets.", ""]
    valid = {name: stage["valid"] for name, stage in results["stages"].items()}
    lines += ["Valid seller messages: " + ", ".join(f"{name} {v:.4f}" for name, v in valid.items()), ""]
    if results.get("kept"):
        lines += [f"`policy/` holds the policy after {results['kept']} (keep = {config.get('keep', 'last')}: chosen on these "
                  "markets, so its figure here is optimistic; held-out figures need other run seeds).", ""]
    return "\n".join(lines)


def _curve(results: dict, path: Path) -> None:
    from negotiate.plots import pyplot

    plt = pyplot()
    config = results["config"]
    stages = list(results["stages"])
    fig, axes = plt.subplots(1, len(config["buyers"]), figsize=(5 * len(config["buyers"]), 3.6), squeeze=False)
    for ax, buyers in zip(axes[0], config["buyers"]):
        means = [sum(_pooled(results["stages"][s]["ratios"][buyers])) / len(_pooled(results["stages"][s]["ratios"][buyers])) for s in stages]
        ax.plot(range(len(stages)), means, marker="o", color="black", label="menu policy")
        for i, (seller, by) in enumerate(results["baselines"].items()):
            values = _pooled(by[buyers])
            ax.axhline(sum(values) / len(values), linestyle="--", linewidth=1, color=f"C{i}", label=seller[:40])
        ax.set_xticks(range(len(stages)), stages)
        ax.set_title(f"{buyers} buyers (run seed {config['eval_seed']})")
        ax.set_ylabel("profit / OPT")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _provenance() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    load = os.getloadavg()[1] if hasattr(os, "getloadavg") else math.nan
    return {"commit": commit + (" + changes" if dirty else ""), "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "load": round(load, 2)}


def config_fields() -> list[str]:
    return [f.name for f in fields(TeachConfig)]
