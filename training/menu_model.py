"""The menu policy's model: how it is made, how it reads a batch of menus, and the losses it is taught with.

A menu policy is a causal language model that reads the menu prompt (``negotiate.agents.menu.render_menu``, through the
tokenizer's chat template) and answers with a letter: its distribution over the menu's options is the softmax of the
letters' logits at the prompt's last position, over the menu's letters alone (:func:`option_logprobs`). Serving reads
the same logits (``negotiate.agents.hf``: ``HFBackend.choose``), so training and serving cannot disagree.

Two kinds of model:

- ``tiny``: a small Llama (hidden 128, 4 layers: about 0.9M parameters, 4 MB in float32) trained from scratch, with a
  byte-level BPE tokenizer trained on the menu prompts of the training markets (digits one token each) and a chat
  template of its own (:func:`build_tiny`). It decides in milliseconds on a CPU, fits in git, and needs nothing but the
  ``hf`` extra: it is what ``learned`` ships.
- any model the ``hf:`` backend loads (``smollm2``, a folder), with a LoRA adapter when ``lora`` (peft): the same recipe
  as post-training of a pretrained model.

The losses (:func:`sft_loss`, :func:`replay_loss`) are per batch of :class:`MenuExample`; :func:`fit` runs AdamW over
examples in shuffled batches.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from negotiate.agents.menu import LETTERS

__all__ = ["MenuExample", "build_tiny", "load_model", "letter_ids", "option_logprobs", "option_logits", "sft_loss", "replay_loss",
           "value_loss", "fit", "save_model",
           "TINY_TEMPLATE"]

TINY_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
"""The tiny model's chat template: role markers and an end token, nothing else."""


TIE = 1e-6
"""Options whose replayed values are this close to the best are best alike (profit/OPT: a dollar is about 1e-3)."""


@dataclass
class MenuExample:
    """One decision to learn from: the prompt's token ids and what the loss needs of it."""

    ids: list[int]
    """The chat prompt's token ids, ready for the reply (the template's generation prompt included)."""
    options: int
    """How many options the menu has (letters A.. of that many)."""
    target: int | None = None
    """SFT: the option to imitate."""
    values: list[float | None] | None = None
    """Replay: each option's value (None: not replayed)."""
    chosen: int | None = None
    """Replay: the option the policy sent when it played."""
    old: list[float] | None = None
    """Replay: the policy's probabilities over the options when it played (None: unknown)."""


def build_tiny(corpus: Sequence[str], *, hidden: int = 128, layers: int = 4, heads: int = 4, vocab: int = 512, seed: int = 0):
    """(model, tokenizer): a small Llama with random weights and a byte-level BPE tokenizer trained on ``corpus`` (every
    digit its own token, each letter of :data:`~negotiate.agents.menu.LETTERS` one token)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    special = ["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = TINY_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    return model, tokenizer


def load_model(name: str, *, lora: bool = True, lora_r: int = 8, lora_alpha: int = 16):
    """(model, tokenizer) of a pretrained model the ``hf:`` backend loads, in float32, LoRA-wrapped when ``lora``."""
    from negotiate.training.trainer import TrainConfig, load_policy

    model, tokenizer = load_policy(TrainConfig(model=name, lora=lora, lora_r=lora_r, lora_alpha=lora_alpha))
    return model, tokenizer


def letter_ids(tokenizer) -> list[int]:
    """The token id of each letter of :data:`~negotiate.agents.menu.LETTERS` (a ``ValueError`` where one is not one
    token)."""
    from negotiate.agents.hf import letter_tokens

    try:
        return letter_tokens(tokenizer, LETTERS)
    except ValueError as error:
        raise ValueError(f"the tokenizer {error}") from None


def encode(tokenizer, messages: list[dict]) -> list[int]:
    """A chat prompt's ids as the ``hf:`` backend encodes them (``negotiate.agents.hf.encode_chat``)."""
    from negotiate.agents.hf import encode_chat

    return encode_chat(tokenizer, messages)


def option_logprobs(model, batch: Sequence[MenuExample], letters: list[int], pad: int):
    """Log-probs over each example's options, shape (batch, 26): the softmax of the letters' logits at the prompt's last
    position over the menu's letters alone; the letters past a menu's length are -inf. The batch is left-padded (one
    forward pass), as serving pads it."""
    import torch

    return torch.log_softmax(option_logits(model, batch, letters, pad), dim=-1)


def option_logits(model, batch: Sequence[MenuExample], letters: list[int], pad: int):
    """The letters' raw logits at each prompt's last position, shape (batch, 26), -inf past a menu's length."""
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, e in enumerate(batch):
        ids[i, width - len(e.ids):] = torch.tensor(e.ids)
        mask[i, width - len(e.ids):] = 1
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    try:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    except TypeError:  # a model class without logits_to_keep
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions)
    logits = out.logits[:, -1, letters].float()
    sizes = torch.tensor([e.options for e in batch], device=device)
    return logits.masked_fill(torch.arange(len(letters), device=device)[None, :] >= sizes[:, None], -math.inf)


def sft_loss(logp, batch: Sequence[MenuExample]) -> tuple:
    """Cross-entropy toward each example's ``target`` option: (loss, stats)."""
    import torch

    target = torch.tensor([e.target for e in batch], device=logp.device)
    picked = logp.gather(1, target[:, None])[:, 0]
    agree = (logp.argmax(-1) == target).float().mean()
    return -picked.mean(), {"agree": agree.item()}


def replay_loss(logp, batch: Sequence[MenuExample], *, regret_floor: float = 0.005, ce_weight: float = 1.0, pg: float = 10.0,
                kl: float = 0.5) -> tuple:
    """The replay round's loss: (loss, stats).

    - ``ce_weight`` x cross-entropy toward each state's best replayed options (all those within :data:`TIE` of the best, as one set),
      weighted by the regret of the option the policy chose when it played (the best value less the chosen one's, plus
      ``regret_floor`` so a state already played well still counts a little);
    - ``pg`` x a policy-gradient step over every option at once: minus the policy's expected advantage, the advantage of
      an option its value less the value the playing policy expected (no sampling: every option was replayed);
    - ``kl`` x the KL divergence from the playing policy's distribution to the new one: kept near it.
    """
    import torch

    device = logp.device
    n = logp.shape[1]
    values = torch.zeros((len(batch), n), device=device)
    known = torch.zeros((len(batch), n), dtype=torch.bool, device=device)
    old = torch.zeros((len(batch), n), device=device)
    has_old = torch.zeros(len(batch), dtype=torch.bool, device=device)
    for i, e in enumerate(batch):
        for j, v in enumerate(e.values):
            if v is not None:
                values[i, j], known[i, j] = v, True
        if e.old is not None:
            old[i, : len(e.old)] = torch.tensor(e.old, device=device)
            has_old[i] = True
    probs = logp.exp()
    old = torch.where(has_old[:, None], old, probs.detach())
    old = old * known
    old = old / old.sum(-1, keepdim=True).clamp(min=1e-12)
    best_value = torch.where(known, values, torch.full_like(values, -math.inf)).max(-1)
    chosen = torch.tensor([e.chosen if e.chosen is not None else -1 for e in batch], device=device)
    baseline = (old * values).sum(-1)
    chosen_value = torch.where(chosen >= 0, values.gather(1, chosen.clamp(min=0)[:, None])[:, 0], baseline)
    weight = (best_value.values - chosen_value).clamp(min=0) + regret_floor  # the best in hindsight: biased toward
    # what a seller who saw the values would do (the highest price a threshold buyer takes); the policy-gradient term is
    # the unbiased one (the options' values averaged over the states' worlds), the cross-entropy speeds it
    # Toward the best options as a set: several often make the same profit (three prices a threshold buyer takes alike),
    # and a single argmax would teach the menu's order (the first of them), not the market.
    best = known & (values >= best_value.values[:, None] - TIE)
    on_best = torch.logsumexp(torch.where(best, logp, torch.full_like(logp, -math.inf)), dim=-1)
    ce = -(weight * on_best).sum() / weight.sum()
    advantage = torch.where(known, values - baseline[:, None], torch.zeros_like(values))
    expected = (probs * advantage).sum(-1).mean()
    safe = torch.where(old > 0, old, torch.ones_like(old))
    divergence = (old * (safe.log() - torch.where(old > 0, logp, torch.zeros_like(logp)))).sum(-1).mean()
    loss = ce_weight * ce - pg * expected + kl * divergence
    stats = {"ce": ce.item(), "advantage": expected.item(), "kl": divergence.item(),
             "best": best.gather(1, logp.argmax(-1)[:, None]).float().mean().item()}
    return loss, stats


def value_loss(logits, batch: Sequence[MenuExample], *, scale: float = 0.02) -> tuple:
    """Regression of each option's replayed value (AggreVaTe's cost-to-go, by squared loss): the letters' logits, centred
    per state, times ``scale`` against the values, centred per state. The greedy policy is then the option of the highest
    predicted value; its softmax at temperature 1 weighs a logit of 1 as ``scale`` of profit/OPT. ``logits`` are the
    letters' raw logits (:func:`option_logits`). Returns (loss, stats)."""
    import torch

    values = torch.zeros_like(logits)
    known = torch.zeros_like(logits, dtype=torch.bool)
    for i, e in enumerate(batch):
        for j, v in enumerate(e.values):
            if v is not None:
                values[i, j], known[i, j] = v, True
    count = known.sum(-1).clamp(min=1)
    centre = lambda x: x - (torch.where(known, x, torch.zeros_like(x)).sum(-1) / count)[:, None]
    predicted = centre(torch.where(known, logits, torch.zeros_like(logits))) * scale
    target = centre(values)
    error = torch.where(known, predicted - target, torch.zeros_like(predicted))
    loss = (error**2).sum() / known.sum().clamp(min=1)
    best = known & (values >= torch.where(known, values, torch.full_like(values, -math.inf)).max(-1).values[:, None] - TIE)
    greedy = torch.where(known, logits, torch.full_like(logits, -math.inf)).argmax(-1)
    return loss / scale**2, {"rmse": float(loss.detach().sqrt()), "best": best.gather(1, greedy[:, None]).float().mean().item()}


def fit(model, examples: list[MenuExample], loss: Callable, *, letters: list[int], pad: int, epochs: float, lr: float,
        batch_size: int, seed: int, weight_decay: float = 0.0, max_grad_norm: float = 1.0, progress=None, raw: bool = False) -> list[dict]:
    """AdamW over ``examples`` in shuffled batches for ``epochs`` passes; ``loss(logp, batch) -> (loss, stats)`` (the raw
    logits instead of log-probs with ``raw``). Returns one stats row per step (``progress(step, total, row)`` sees each)."""
    import torch

    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps = max(1, math.ceil(epochs * len(examples) / batch_size))
    order: list[int] = []
    rows = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        batch = [examples[k] for k in order[:batch_size]]
        del order[:batch_size]
        logp = (option_logits if raw else option_logprobs)(model, batch, letters, pad)
        value, stats = loss(logp, batch)
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        row = {"step": step + 1, "loss": value.item(), **stats}
        rows.append(row)
        if progress is not None:
            progress(step + 1, steps, row)
    model.eval()
    return rows


def save_model(model, tokenizer, out: Path) -> Path:
    """The policy as a folder ``hf:`` loads: merged weights (a LoRA adapter merged into a copy) and the tokenizer."""
    import copy

    out.mkdir(parents=True, exist_ok=True)
    merged = model
    if hasattr(model, "merge_and_unload"):
        merged = copy.deepcopy(model).merge_and_unload()
    merged.config.use_cache = True
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
