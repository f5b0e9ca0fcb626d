"""``negotiate train`` under torchrun: two processes on the CPU (gloo), the tiny llama of ``tiny_model``.

SFT: two processes taking one decision each of a two-decision batch reach the checkpoint one process
reaches on the same batches, and log the same losses and gradient norms; only rank 0 writes.
online-grpo: two processes play one TRL step, each copy of a market a different episode, and rank 0
writes one checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from negotiate.cli import main

from tiny_model import build_tiny_llama

for _name in ("torch", "transformers", "peft"):  # the train extra: pip install 'negotiate[train]'
    pytest.importorskip(_name)

pytestmark = [pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "run"
    assert main(["collect", "--seller", "greedy", "--markets", "3", "--seed", "5", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, traces):
    from negotiate.training.dataset import load_episodes

    completions = tuple(d.completion for ep in load_episodes([traces]) for d in ep.decisions)
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-dist"), completions, vocab=600)


def negotiate_train(args: list[str], *, processes: int, timeout: int = 400) -> subprocess.CompletedProcess:
    """``negotiate train ARGS``, as one process or under torchrun (``--standalone``: a free port on loopback)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    if processes == 1:
        cmd = [sys.executable, "-m", "negotiate", "train", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "negotiate", "train", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors") | {f"adapter.{k}": v for k, v in load_file(folder / "adapter" / "adapter_model.safetensors").items()}


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# (decisions per step, micro_batch of the one process, of each of the two, the weights' tolerance)
EXACT = (2, 1, 1, 1e-6)
"""One forward pass per decision in both runs: both compute g0 + g1 (accumulated by backward in one, added by the
all-reduce in the other). Float addition of two terms is commutative and each g is computed alike (one thread, the same
shapes), so the weights should agree exactly: 1e-6, on weights of order 0.1, allows a few ulps per step (measured: 0.0)."""
REORDERED = (4, 4, 2, 1e-4)
"""The default way: each process runs its share in one pass over the shared prompt prefix. The batched passes and the
order of the sums differ ((g0 + g1 + g2 + g3) against (g0 + g2) + (g1 + g3)), so the runs agree to float32 rounding only,
as far as AdamW carries it: its step divides by the gradient's running scale, so a rounding difference in a near-zero
gradient entry becomes a visible one in its weight. Measured after 4 steps: 2.7e-6 (3.2e-8 with another tiny model).
1e-4 allows 37 times that, and stays 16 times below the 1.6e-3 of a rank that trains on the whole batch."""


@pytest.mark.parametrize("batch, micro_one, micro_two, tolerance", [EXACT, REORDERED], ids=["exact", "reordered"])
def test_two_processes_sharing_each_batch_reach_the_checkpoint_of_one_process(tiny, traces, tmp_path, batch, micro_one, micro_two,
                                                                               tolerance):
    # The same global batch per step, drawn from one seeded shuffle: one process takes all of it, or each of two takes
    # every other decision. The loss is summed over the batch's decisions and divided by the batch's token count, so the
    # processes' gradients add up to the one process's.
    common = ["--model", str(tiny), "--traces", str(traces), "--method", "sft", "--batch-size", str(batch), "--max-steps", "4",
              "--lr", "0.01", "--threads", "1", "--quiet", "--set", "lora_r=4", "--set", "lora_alpha=8"]
    one, two = tmp_path / "one", tmp_path / "two"
    negotiate_train([*common, "--set", f"micro_batch={micro_one}", "--out", str(one)], processes=1)
    negotiate_train([*common, "--set", f"micro_batch={micro_two}", "--out", str(two)], processes=2)
    a, b = weights(one), weights(two)
    assert a.keys() == b.keys()
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert gap <= tolerance, gap
    # Training moved the weights far beyond the tolerance (by 0.053 here): the comparison would see a wrong gradient.
    from safetensors.torch import load_file

    start = load_file(tiny / "model.safetensors")
    moved = max(float((a[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3, moved
    # The logged loss and gradient norm are the whole batch's: a rank that trained on the whole batch (or both on one
    # half) would log another loss, even where Adam and clipping hide a doubled gradient in the weights.
    ra, rb = rows(one), rows(two)
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    for x, y in zip(ra, rb):
        assert (x["tokens"], x["batch_reward"]) == (y["tokens"], y["batch_reward"])
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5) and y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    # Rank 0 alone wrote: the same files as one process, one summary, one log's worth of lines.
    assert sorted(p.relative_to(two).as_posix() for p in two.rglob("*")) == sorted(p.relative_to(one).as_posix() for p in one.rglob("*"))
    summary = json.loads((two / "train.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 4
    logged = [json.loads(line) for line in (two / "train.log.jsonl").read_text().splitlines()]
    assert [line["rank"] for line in logged if line["event"] == "train"] == [0]


def test_a_batch_smaller_than_the_processes_is_refused_in_one_line(tiny, traces, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "--model", str(tiny), "--traces", str(traces), "--batch-size", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--batch-size: 2: must be at least the number of processes (3): each takes a share of every batch" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "3")
    assert main(["train", "--model", str(tiny), "--traces", str(traces), "--out", str(tmp_path / "x")]) == 2
    assert "RANK: 3: must be from 0 to WORLD_SIZE - 1 (2)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


ONLINE = """
import json, os, sys
from negotiate.cli import main
from negotiate.protocol import SELLER
from negotiate.training import online
from negotiate.training.rewards import REWARDS

# A random tiny model breaks every rule alike; reward something its samples vary in, so the step has a signal.
REWARDS["characters"] = lambda events: float(sum(len(e.get("raw", "")) for e in events if e["type"] == "message" and e["sender"] == SELLER))
played, real = [], online.play_episodes

def spy(model, tokenizer, config, jobs, **kwargs):
    if kwargs.get("label") == "rollout":
        played.extend(jobs)
    return real(model, tokenizer, config, jobs, **kwargs)

online.play_episodes = spy
code = main(["train", *sys.argv[1:]])
with open(os.path.join(os.environ["JOBS"], f"rank-{os.environ['RANK']}.json"), "w") as f:
    json.dump(played, f)
sys.exit(code)
"""


def test_online_grpo_under_two_processes_plays_distinct_episodes_and_rank_0_writes_one_checkpoint(tiny, traces, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    script = tmp_path / "online.py"
    script.write_text(ONLINE)
    monkeypatch.setenv("JOBS", str(tmp_path))
    out = tmp_path / "online"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
                           "--model", str(tiny), "--method", "online-grpo", "--set", "reward=characters", "--set", "split=train",
                           "--set", "markets=2", "--set", "group=4", "--batch-size", "4", "--max-steps", "1", "--lr", "0.01",
                           "--set", "temperature=1.5", "--set", "max_tokens=12", "--set", "gen_batch=8", "--eval-episodes", "3",
                           "--threads", "1", "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=500, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    # TRL gave each process 2 of the step's 4 copies of one market (group 4): together they played 4 different episodes
    # of it (each copy numbered after the copies the ranks before hold, offset by the step), not the same 2 twice.
    jobs = [tuple(j) for r in (0, 1) for j in json.loads((tmp_path / f"rank-{r}.json").read_text())]
    assert len(jobs) == 4 and len(set(jobs)) == 4 and len({j[0] for j in jobs}) == 1
    assert all(json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))  # both ranks played
    summary = json.loads((out / "train.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 1
    assert (out / "model.safetensors").is_file() and (out / "adapter" / "adapter_model.safetensors").is_file()
    # The evaluation episodes were shared out (2 and 1) and rank 0 wrote all 3, in order, once per evaluation.
    for step in (0, 1):
        lines = [json.loads(line) for line in (out / "eval" / f"step-{step:05d}.jsonl").read_text().splitlines()]
        starts = [e["episode"] for e in lines if e["type"] == "episode_start"]
        assert starts == [f"step-{step}-{i:06d}-00" for i in range(3)]
    metrics = rows(out)
    assert [r["step"] for r in metrics if "loss" in r] == [1] and metrics[-1]["eval"]["episodes"] == 3
