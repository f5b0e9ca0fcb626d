"""The market as a verifiers (0.4, ``verifiers.v1``) environment: the policy model plays the seller.

Each task is one market of a run (``negotiate serve --seed S``'s episode ``index``); each rollout plays it with
:func:`negotiate.episode.run_episode` as ``negotiate serve --fresh --seller openai:...`` would. The seller is the
project's own :class:`~negotiate.agents.llm.LLMSeller` under a :class:`~negotiate.agents.policy.Policy`: its prompt
view renders every decision's prompt (system and user, the very messages a served seller sends) and reads the reply
back (lenient parsing, clamps, re-asks). Only its backend differs: each model call is one turn of the verifiers
interaction (:class:`InteractionBackend`), and :class:`ViewHarness`, an in-process harness, sends exactly that
turn's messages to the rollout's interception endpoint, so verifiers records every call (tokens, usage, timing) and
its sampling settings apply. The buyers are the run's (scripted by default), answering through the runtime;
``fresh`` (default on) asks the seller only once they have answered, so each turn sees the reply to the last one.

The rubric is the project's: the reward is a named function of the episode's trace (``reward``, default
``profit-penalized``: profit / OPT minus 0.1 per seller violation, :mod:`negotiate.training.rewards`), and the
metrics (profit / OPT, welfare / OPT, valid-message rate, seller violations, deals, turns) come from
:func:`negotiate.metrics.metrics_from_events`. The episode's own trace rides on the verifiers trace
(``trace.info["negotiate"]``: its events as ``negotiate serve`` writes them). An episode that fails (the model
call failed, a limit ended the exchange) fails the verifiers episode: a crash is nobody's strategy.

verifiers loads plugins by plain module name: the taskset id ``negotiate-market`` imports ``negotiate_market``, the
top-level module negotiate installs, which re-exports this module's Taskset, Harness and Env. So in Python,
``load_environment(...)`` returns the environment, and from a shell ``vf-eval negotiate-market <vf-eval arguments>``
(or ``python -m negotiate.envs.verifiers_env <vf-eval arguments>``) runs ``vf-eval`` with it (``--env.taskset.*`` sets
:class:`MarketTasksetConfig`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import cached_property

try:
    import aiohttp
    import verifiers.v1 as vf
except ModuleNotFoundError as error:  # pragma: no cover - the extra is there whenever the tests run this module
    raise ModuleNotFoundError(f"negotiate.envs.verifiers_env needs the verifiers extra ({error.name} is missing): "
                              "pip install 'negotiate[verifiers]'") from None

import orjson
from verifiers.v1.dialects.chat import message_to_wire

from negotiate.agents.contract import Completion, LLMError
from negotiate.agents.policy import Policy
from negotiate.agents.registry import parse_agent, policy_seller
from negotiate.market import resolve_spec
from negotiate.metrics import metrics_from_events
from negotiate.run import LOCAL_TIMEOUT, Run, RunConfig, market_seed
from negotiate.trace import encode
from negotiate.training.rewards import DEFAULT_REWARD, reward_fn

__all__ = ["MarketTasksetConfig", "MarketData", "MarketTask", "MarketTaskset", "ViewHarnessConfig", "ViewHarness",
           "MarketEnvConfig", "MarketEnv", "InteractionBackend", "load_environment", "TASKSET_ID", "METRICS"]

TASKSET_ID = "negotiate-market"
"""The taskset (and harness) id verifiers knows this module by; it imports ``negotiate_market``, which re-exports it."""

METRICS = ("profit_ratio", "welfare_ratio", "valid_rate", "deals", "turns_used", "opt")
"""The episode metrics recorded on each verifiers trace (seller violations are recorded too, as ``violations``)."""


class MarketTasksetConfig(vf.TasksetConfig):
    """Which markets, which buyers, and the seller's policy (``--env.taskset.<field>``)."""

    split: str = "train"
    """A split (train, shapes, correlated, prices-x10) or a TOML market spec file."""
    seed: int = 0
    """Run seed: task ``i`` is the market ``negotiate serve --seed SEED`` plays as its episode ``i``."""
    markets: int = 8
    """Tasks: the run's first markets."""
    buyers: str = "threshold"
    """The buyer spec every buyer plays (threshold, concession, mixed, stubborn, random, or a model)."""
    prompt: str = "full"
    """The seller's prompt view (full, compact, facts, advice, tools)."""
    format: str = "json"
    """The reply's format (json, or tagged: every view but full needs it)."""
    temperature: float = 0.7
    """Sampling temperature sent with each request (verifiers' ``--sampling.temperature`` overrides it)."""
    max_tokens: int = 96
    """Reply token budget sent with each request (verifiers' ``--sampling.max-tokens`` overrides it)."""
    reask: int = 0
    """Re-asks after an unparseable reply, with the error (each one is a turn)."""
    fresh: bool = True
    """Ask the seller only once every scripted buyer has answered (``negotiate serve --fresh``)."""
    reward: str = DEFAULT_REWARD
    """The reward, by name (profit-penalized, profit, welfare, adherence)."""

    def policy(self) -> Policy:
        """The seller's policy, checked (``legal=1`` is not offered: it needs vLLM's structured outputs)."""
        policy = Policy(prompt=self.prompt, format=self.format, temperature=self.temperature, max_tokens=self.max_tokens,
                        reask=self.reask)
        policy.check(flag=lambda name: f"--env.taskset.{name.replace('_', '-')}")
        return policy


class MarketData(vf.TaskData):
    info: dict
    """``run_seed``, ``index`` and ``market_seed``: what reproduces the market."""


class MarketTask(vf.Task[MarketData, vf.State, vf.TaskConfig]):
    pass


class MarketTaskset(vf.Taskset[MarketTask, MarketTasksetConfig]):
    """The run's first ``markets`` markets, one task each (the prompt is the seller's first decision, rendered live)."""

    def load(self):
        config = self.config
        resolve_spec(config.split, "--env.taskset.split")
        config.policy()
        reward_fn(config.reward)
        parse_agent(config.buyers, "buyer", field_name="--env.taskset.buyers")
        for index in range(config.markets):
            yield MarketTask(MarketData(name=f"{config.split}#{index}", prompt=None,
                                        info={"run_seed": config.seed, "index": index,
                                              "market_seed": market_seed(config.seed, index)}), config.task)


class ViewHarnessConfig(vf.HarnessConfig):
    pass


class _ViewSession(vf.HarnessSession):
    """One turn is one chat request of exactly the turn's messages (the view's prompt), not the conversation so far."""

    async def _run(self, messages) -> vf.ProgramResult:
        if messages is None:
            return vf.ProgramResult(2, "", "this environment opens every turn itself: its tasks carry no prompt")
        body = {"model": self.ctx.model, "messages": [message_to_wire(m) for m in messages]}
        headers = {"Authorization": f"Bearer {self.secret}"}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.endpoint}/chat/completions", json=body, headers=headers) as response:
                text = await response.text()
        if response.status != 200:
            return vf.ProgramResult(1, "", f"the model call failed: HTTP {response.status}: {text[:500]}")
        return vf.ProgramResult(0, text, "")


class ViewHarness(vf.Harness[ViewHarnessConfig]):
    """In-process: no program, no tools; each turn's messages go to the interception endpoint as they are."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def session(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        return _ViewSession(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):  # pragma: no cover - _ViewSession runs turns
        raise vf.HarnessError("ViewHarness runs its turns through its session")


class InteractionBackend:
    """A seller's backend whose every ``complete`` is one turn of a verifiers interaction."""

    name = "verifiers"

    def __init__(self, interaction, model: str):
        self.interaction = interaction
        self.model = model

    def describe(self) -> dict:
        return {"backend": self.name, "model": self.model}

    async def complete(self, messages: list[dict], *, role: str, seed=None, **ask) -> Completion:
        if ask:
            raise LLMError(f"the verifiers environment cannot pass {', '.join(ask)} to the model (legal=1 needs vLLM)")
        started = time.perf_counter()
        segment = await self.interaction.turn(messages)
        if segment.terminated:
            raise LLMError(f"the verifiers rollout ended before the seller's reply ({self.interaction.trace.stop_condition})")
        calls = self.interaction.trace.calls
        call = calls[-1] if calls else None
        usage = call.usage.model_dump(exclude_none=True) if call is not None and call.usage is not None else None
        return Completion(segment.last_reply, call.finish_reason if call else None, (call.model if call else None) or self.model,
                          time.perf_counter() - started, usage=usage)


class MarketEnvConfig(vf.EnvConfig):
    seller: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The seat the policy model plays (``--env.seller.*``). Its harness runs in-process and executes nothing, so
    the local runtime is the default (verifiers' own default is a remote sandbox)."""


@dataclass(frozen=True)
class _ModelSeller:
    """The policy model as a seller spec of :class:`~negotiate.run.Run`: the project's seller under ``policy``, its every
    model call a turn of the rollout's interaction (``backend``)."""

    policy: Policy
    backend: InteractionBackend
    text: str = "verifiers"
    """The seller's name in the trace's labels."""

    def build(self, market, seed, pools=None):
        return policy_seller(self.policy, self.backend, market, seed)


class MarketEnv(vf.Env[MarketEnvConfig]):
    """One rollout plays one market: the model as the seller, the run's buyers answering through the runtime. The episode
    is built by :class:`~negotiate.run.Run`, as ``negotiate serve --fresh`` builds episode ``index`` of the run seeded
    ``run_seed`` (its market, seeds, labels and deadlines); the spec file is read and the buyer spec parsed once per
    environment, not once per rollout."""

    @cached_property
    def market_spec(self):
        return resolve_spec(self.taskset.config.split, "--env.taskset.split")

    @cached_property
    def buyer_spec(self):
        return parse_agent(self.taskset.config.buyers, "buyer", field_name="--env.taskset.buyers")

    def market_run(self, run_seed: int) -> Run:
        """The run whose episodes the tasks are: ``run_seed``'s markets, the taskset's buyers, ``fresh`` as it says, and
        deadlines no model on a CPU misses."""
        config: MarketTasksetConfig = self.taskset.config
        return Run(RunConfig(sellers=("verifiers",), buyers=config.buyers, split=config.split, seed=run_seed, fresh=config.fresh,
                             seller_timeout=LOCAL_TIMEOUT, reply_timeout=LOCAL_TIMEOUT), spec=self.market_spec, buyers=self.buyer_spec)

    async def run(self, task, agents) -> None:
        config: MarketTasksetConfig = self.taskset.config
        info = task.data.info
        run = self.market_run(info["run_seed"])
        async with agents.seller.interaction(task) as interaction:
            seller = _ModelSeller(config.policy(), InteractionBackend(interaction, interaction.trace.agent.config.model or ""))
            plan = run.episode(seller, info["index"], episode_id=f"verifiers-{info['index']:06d}")
            async with run:
                episode = await plan.play()
        trace = interaction.trace
        trace.info["negotiate"] = [orjson.loads(line) for line in bytes(encode(episode.events)).splitlines()]
        if episode.failed:
            raise RuntimeError(f"the negotiate episode failed: {episode.reason}")
        trace.record_reward(config.reward, reward_fn(config.reward)(episode.events))
        metrics = metrics_from_events(episode.events)
        for name in METRICS:
            if metrics[name] is not None:
                trace.record_metric(name, metrics[name])
        trace.record_metric("violations", sum(metrics["violations"].values()))


def load_environment(**taskset) -> MarketEnv:
    """The environment for the markets ``taskset`` names (:class:`MarketTasksetConfig`'s fields, e.g. ``split="train",
    markets=4, buyers="concession", prompt="compact", format="tagged"``)."""
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": TASKSET_ID, **taskset}}))


def main(argv: list[str] | None = None) -> None:
    """``vf-eval`` with this environment loaded: ``python -m negotiate.envs.verifiers_env [vf-eval arguments]``
    (the taskset id is added when none is given)."""
    from verifiers.v1.cli.eval.main import main as vf_eval

    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(arg.startswith("--env.taskset.id") for arg in argv):
        argv = ["--env.taskset.id", TASKSET_ID, *argv]
    vf_eval(argv)


if __name__ == "__main__":
    from negotiate.envs.verifiers_env import main as _main  # the module negotiate_market re-exports, not __main__

    _main()
