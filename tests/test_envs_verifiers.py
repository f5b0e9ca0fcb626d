"""negotiate.envs.verifiers_env through verifiers' own entry point (``vf-eval``'s main, as
``python -m negotiate.envs.verifiers_env``): against the stand-in OpenAI server it plays the episodes ``negotiate serve
--fresh`` plays with the same model, and against the real llama.cpp server (marked ``llamacpp``) a few small ones."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from needs import missing

if importlib.util.find_spec("verifiers") is None:
    missing("the verifiers extra is not installed: pip install -e '.[verifiers]'", "NEGOTIATE_REQUIRE_ENVS")

from fake_openai import serve_in_thread  # noqa: E402

from negotiate.cli import main  # noqa: E402
from negotiate.envs.verifiers_env import METRICS, TASKSET_ID, MarketEnv, load_environment  # noqa: E402
from negotiate.errors import UserError  # noqa: E402
from negotiate.metrics import metrics_from_events  # noqa: E402
from negotiate.trace import EpisodeRecord, read_episodes  # noqa: E402
from negotiate.training.rewards import profit_penalized  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def vf_eval(out: Path, model: str, base_url: str, *args: str, timeout: float = 300, command: list[str] | None = None,
            cwd: Path = ROOT) -> list[dict]:
    """Run vf-eval with the environment (a child process, as a user runs it; ``command`` in place of ``python -m
    negotiate.envs.verifiers_env``) and return its episodes."""
    command = [*(command or [sys.executable, "-m", "negotiate.envs.verifiers_env"]), "--model", model, "--client.base-url",
               base_url, "--client.api-key-var", "NEGOTIATE_TEST_KEY", "--no-push", "--no-rich", "-o", str(out), "--run.name",
               "run", *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=dict(env, NEGOTIATE_TEST_KEY="none"))
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in (out / "run" / "traces.jsonl").read_text().splitlines()]


def _played(trace: dict) -> EpisodeRecord:
    return EpisodeRecord.of(trace["info"]["negotiate"])


def _same_game(events) -> list[dict]:
    """What two plays of one market by one model share: the events less clocks, ids, who played and backend details."""
    drop = {"ts", "wall_s", "episode", "extra"}
    return [{k: v for k, v in dict(event).items() if k not in drop} for event in events[1:]]


def test_load_environment_builds_the_taskset_of_the_runs_markets():
    env = load_environment(split="train", markets=3, seed=5, buyers="concession")
    assert isinstance(env, MarketEnv) and env.config.taskset.id == TASKSET_ID
    tasks = list(env.taskset)
    assert [t.data.info["index"] for t in tasks] == [0, 1, 2] and all(t.data.prompt is None for t in tasks)


def test_negotiate_market_is_the_module_verifiers_loads_by_the_id_and_names_one_taskset_harness_and_env():
    import negotiate_market
    import verifiers.v1 as vf
    from verifiers.v1.utils import loaders

    import negotiate.envs.verifiers_env as module

    assert negotiate_market.load_environment is module.load_environment and negotiate_market.TASKSET_ID == TASKSET_ID
    assert loaders.import_taskset(TASKSET_ID) is negotiate_market
    # What verifiers takes from the module: exactly one Taskset, Harness and Env subclass, the harness defaulting to ours.
    assert loaders.taskset_class(TASKSET_ID) is module.MarketTaskset and loaders.harness_class(TASKSET_ID) is module.ViewHarness
    assert loaders.environment_class(TASKSET_ID) is MarketEnv and loaders.default_harness_id(TASKSET_ID) == TASKSET_ID
    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": TASKSET_ID, "markets": 2, "seed": 5}}))
    assert isinstance(env, MarketEnv) and [t.data.info["index"] for t in env.taskset] == [0, 1]


def test_vf_eval_loads_the_market_by_its_id_from_a_folder_outside_the_checkout(tmp_path):
    """``vf-eval negotiate-market`` as a user types it: verifiers imports the installed ``negotiate_market`` (it exited 1,
    "tried to import 'negotiate_market'", issue 51 item 13)."""
    script = Path(sys.executable).with_name("vf-eval")
    command = [str(script)] if script.exists() else [sys.executable, "-c",
                                                     "import sys; from verifiers.v1.cli.eval.main import main; sys.exit(main())"]
    (tmp_path / "cwd").mkdir()
    with serve_in_thread() as server:
        episodes = vf_eval(tmp_path / "vf", server.model, server.url, "-n", "1", "--env.taskset.markets", "1",
                           "--env.taskset.buyers", "concession", command=[*command, TASKSET_ID], cwd=tmp_path / "cwd")
    assert len(episodes) == 1 and episodes[0]["ok"] and not episodes[0]["errors"]
    (trace,) = episodes[0]["traces"]
    played = _played(trace)
    assert played.outcome in ("terminated", "truncated")
    assert trace["rewards"]["profit-penalized"]["score"] == pytest.approx(profit_penalized(played.events))


def test_a_bad_setting_is_one_line_naming_the_field():
    with pytest.raises(UserError, match="^--env.taskset.prompt: 'poem': choose from full, compact"):
        list(load_environment(prompt="poem").taskset)


@pytest.mark.parametrize("prompt,fmt", [("full", "json"), ("advice", "tagged")])
def test_vf_eval_plays_the_episodes_serve_plays_with_the_same_model_and_scores_them_with_the_projects_reward(tmp_path, prompt, fmt):
    seed, markets = 3, 2
    with serve_in_thread() as server:
        episodes = vf_eval(tmp_path / "vf", server.model, server.url, "-n", str(markets), "--env.taskset.markets",
                           str(markets), "--env.taskset.seed", str(seed), "--env.taskset.buyers", "concession",
                           "--env.taskset.prompt", prompt, "--env.taskset.format", fmt)
        requests = [r["messages"] for r in server.requests]
        served = tmp_path / "serve"
        seller = f"openai:{server.model}@{server.url}?temperature=0.7&max_tokens=96&prompt={prompt}&format={fmt}"
        assert main(["serve", "--seller", seller, "--buyers", "concession", "--episodes", str(markets), "--seed", str(seed),
                     "--fresh", "--out", str(served), "--quiet"]) == 0
    expected = {e[0]["index"]: EpisodeRecord.of(e) for e in read_episodes(next(served.glob("openai-*.jsonl")))}
    assert len(episodes) == markets and all(e["ok"] and not e["errors"] for e in episodes)
    prompts = []
    for episode in episodes:
        (trace,) = episode["traces"]
        played = _played(trace)
        index = played.start.index
        assert played.start.market == expected[index].start.market and played.start.seed == expected[index].start.seed
        assert _same_game(played.events) == _same_game(expected[index].events)
        seller_messages = [e for e in played.messages() if e.sender == "seller"]
        assert seller_messages and len(trace["calls"]) == len(seller_messages)  # one model call per seller decision
        prompts += [e.extra["prompt"] for e in seller_messages]
        # The rubric is the project's reward and metrics, recomputed from the trace the episode carries.
        assert trace["rewards"]["profit-penalized"]["score"] == pytest.approx(profit_penalized(played.events))
        metrics = metrics_from_events(played.events)
        assert {k: trace["metrics"][k] for k in METRICS if metrics[k] is not None} == \
            pytest.approx({k: metrics[k] for k in METRICS if metrics[k] is not None})
    # Every request the model got was one decision's prompt as the view rendered it (system and user), nothing more.
    assert sorted(map(json.dumps, requests)) == sorted(map(json.dumps, prompts))
    assert all([m["role"] for m in r] == ["system", "user"] for r in requests)


# -- the real llama.cpp server (the fixture tests/test_llamacpp.py starts; its skips and CI's requirement apply) ------

try:
    from test_llamacpp import MODEL as LLAMA_MODEL
    from test_llamacpp import llamacpp  # noqa: F401  (the module-scoped server fixture, used by name)
except pytest.skip.Exception as skipped:
    LLAMA_MODEL, _why = "", str(skipped)

    @pytest.fixture(scope="module")
    def llamacpp():
        pytest.skip(_why)


@pytest.mark.llamacpp
@pytest.mark.timeout(900)  # a real server starts, then answers one request at a time at CPU speed
def test_vf_eval_plays_small_markets_against_smollm2_on_llama_cpp(llamacpp, tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny"\nbuyers = 1\nproducts = 1\nbudget = 2\n')
    markets = 2
    episodes = vf_eval(tmp_path / "vf", LLAMA_MODEL, llamacpp, "-n", str(markets), "-c", "1", "--env.taskset.split", str(spec),
                       "--env.taskset.markets", str(markets), "--env.taskset.format", "tagged", "--env.taskset.max-tokens", "48",
                       timeout=800)
    assert len(episodes) == markets and all(e["ok"] for e in episodes), [e["errors"] for e in episodes]
    for episode in episodes:
        (trace,) = episode["traces"]
        played = _played(trace)
        seller_messages = [e for e in played.messages() if e.sender == "seller"]
        # Whatever SmolLM2 says, the runtime stays correct: one model call per seller turn, within the budget of 2.
        assert 1 <= len(seller_messages) == len(trace["calls"]) <= 2
        assert played.outcome in ("terminated", "truncated") and played.end.turns_used <= 2
        for event in seller_messages:
            assert event.extra["backend"] == "verifiers" and event.extra["model"] == LLAMA_MODEL
            assert [m["role"] for m in event.extra["prompt"]] == ["system", "user"]
            assert event.valid or (event.error and event.raw)  # an invalid reply keeps the model's text
        assert trace["rewards"]["profit-penalized"]["score"] == pytest.approx(profit_penalized(played.events))
        assert trace["metrics"]["violations"] == sum(metrics_from_events(played.events)["violations"].values())


def test_the_environment_builds_its_episodes_through_run_and_reads_the_spec_once(tmp_path, monkeypatch):
    """Each rollout's episode is Run.episode's (the market, seeds, labels and deadlines of serve --fresh's episode
    `index`); the spec file is read once per environment (it was read again on every rollout)."""
    import negotiate.envs.verifiers_env as module
    from negotiate.market import generate, load_spec
    from negotiate.run import LOCAL_TIMEOUT, market_seed

    spec = tmp_path / "small.toml"
    spec.write_text('split = "train"\nbuyers = 2\nproducts = 2\n')
    reads = []
    monkeypatch.setattr(module, "resolve_spec", lambda *args: reads.append(args) or load_spec(spec))
    env = load_environment(split=str(spec), markets=2, seed=3, buyers="concession")

    class Seller:
        text = "verifiers"

        def build(self, market, seed, pools=None):
            return None

    plans = [env.market_run(3).episode(Seller(), index, episode_id=f"verifiers-{index:06d}") for index in (0, 1, 0)]
    assert len(reads) == 1  # the environment's spec, read once for every rollout
    assert [plan.market for plan in plans] == [generate(load_spec(spec), market_seed(3, i)) for i in (0, 1, 0)]
    assert plans[1].labels == {"run_seed": 3, "index": 1, "seed": market_seed(3, 1), "seller": "verifiers", "buyers": "concession",
                               "fresh": True}
    assert (plans[0].seller_timeout, plans[0].reply_timeout, plans[0].fresh) == (LOCAL_TIMEOUT, LOCAL_TIMEOUT, True)
