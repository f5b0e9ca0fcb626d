"""The policy's log-probs of recorded completions, batched and exact, and what keeps their memory small.

:class:`Example` is one decision as tokens; :func:`batch_logprobs` reads the completions' log-probs of a batch in one
pass (the shared prompt prefix once, logits only at completion positions); :func:`checkpoint_layers` and
:func:`return_freed_memory` bound a step's memory (gradient checkpointing over a cache a recomputed layer cannot grow,
and freed tensors given back to the system). ``negotiate.training.trainer`` builds its losses on them; torch and
transformers load only when a function runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Example", "encode_completion", "completion_logprobs", "batch_logprobs", "checkpoint_layers", "return_freed_memory",
           "MIN_SHARED", "MMAP_THRESHOLD"]


@dataclass
class Example:
    """One decision as tokens, ready for the loss."""

    prompt_ids: list[int]
    completion_ids: list[int]
    weight: float
    """sft, rft: 1; offline-grpo: the episode's advantage."""
    old_logprobs: list[float] | None
    """Log-probs of the completion under the policy that sampled it (None: computed before the first update)."""
    reward: float
    valid: bool


def encode_completion(tokenizer, messages: list[dict], completion: str, stops: set[int]) -> list[int]:
    """The completion's token ids, ending with the token that closes an assistant turn in the chat template."""
    prefix = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": completion}], tokenize=False)
    tail = full[len(prefix):] if full.startswith(prefix) else completion
    ids = list(tokenizer(tail, add_special_tokens=False)["input_ids"])
    for k, token in enumerate(ids):
        if token in stops:
            return ids[: k + 1]
    return ids + [min(stops)] if stops else ids



def completion_logprobs(model, example: Example):
    """Log-prob of each completion token under ``model`` (a 1-D tensor, differentiable)."""
    return batch_logprobs(model, [example], share_prefix=False)[0]


def _common_prefix(rows: list[list[int]]) -> int:
    first, n = rows[0], min(len(r) for r in rows)
    for k in range(n):
        token = first[k]
        if any(r[k] != token for r in rows):
            return k
    return n


MIN_SHARED = 32
"""Fewer shared prompt tokens than this: no prefix pass (its bookkeeping would cost more than it saves)."""


def batch_logprobs(model, examples: list[Example], *, share_prefix: bool = True) -> list:
    """Log-probs of each example's completion tokens under ``model`` (1-D tensors, differentiable), in one batch.

    Exact, and cheaper than one forward pass per example:
    - the prompt prefix every example shares (the system prompt: about 300 of a seller decision's
      500-600 tokens) runs once, and its keys and values are reused by every row; its gradient
      is the sum over rows, as in separate passes;
    - the rest of each prompt and its completion are left-padded to one length (masked, with
      positions given explicitly), so every completion ends the row;
    - logits are computed only at the completion's positions (``logits_to_keep``): at SmolLM2's
      49k vocabulary, the head over every prompt position cost about a tenth of the pass.
    """
    import torch

    device = model.device
    prompts = [ex.prompt_ids for ex in examples]
    shared = _common_prefix(prompts) if share_prefix and len(examples) > 1 else 0
    shared = min(shared, min(len(p) for p in prompts) - 1)  # each row keeps a prompt token: it predicts the first completion token
    if shared < MIN_SHARED:
        shared = 0
    cache = None
    if shared:
        from transformers.cache_utils import Cache

        prefix = torch.tensor([prompts[0][:shared]], device=device)
        cache = model(input_ids=prefix, past_key_values=Cache(layer_class_to_replicate=_replayable()), use_cache=True,
                      logits_to_keep=1).past_key_values
    rows = [ex.prompt_ids[shared:] + ex.completion_ids for ex in examples]
    width = max(len(r) for r in rows)
    keep = max(len(ex.completion_ids) for ex in examples) + 1
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), shared + width), dtype=torch.long, device=device)
    positions = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask[:, :shared] = 1
    for b, row in enumerate(rows):
        pad = width - len(row)
        ids[b, pad:] = torch.tensor(row, device=device)
        mask[b, shared + pad:] = 1
        positions[b, pad:] = torch.arange(shared, shared + len(row), device=device)
    kwargs = {}
    if cache is not None:
        layers = [_replayable()(layer.keys.expand(len(rows), -1, -1, -1), layer.values.expand(len(rows), -1, -1, -1))
                  for layer in cache.layers]
        kwargs["past_key_values"] = Cache(layers=layers)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None, logits_to_keep=keep,
                   **kwargs).logits
    out = []
    for b, ex in enumerate(examples):
        n = len(ex.completion_ids)
        picked = logits[b, keep - 1 - n : keep - 1].float()
        targets = torch.tensor(ex.completion_ids, device=device)
        out.append(torch.log_softmax(picked, dim=-1).gather(-1, targets[:, None])[:, 0])
    return out


@functools.cache
def _replayable():
    """The cache layer class of :func:`batch_logprobs`, made on first use (transformers loads only for a run that trains)."""
    from transformers.cache_utils import DynamicLayer

    class Replayable(DynamicLayer):
        """One layer's keys and values of the shared prompt prefix, in a form a checkpointed layer may run twice.

        A plain cache appends at every call, so a layer recomputed in the backward pass would see the prefix
        twice (transformers therefore drops the cache under gradient checkpointing, which would silently
        train on rows without their prefix). Here an update never appends: the prefix pass (made empty)
        stores the states it is given, replacing them when recomputed, and the pass over the rows (made with
        the prefix) returns the prefix joined to the rows' states and stores nothing."""

        def __init__(self, keys=None, values=None):
            super().__init__()
            self.fixed = keys is not None
            if self.fixed:
                self.keys, self.values, self.dtype, self.device, self.is_initialized = keys, values, keys.dtype, keys.device, True

        def update(self, key_states, value_states, *args, **kwargs):
            import torch

            if self.fixed:
                return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
            self.keys, self.values, self.dtype, self.device, self.is_initialized = (key_states, value_states, key_states.dtype,
                                                                                    key_states.device, True)
            return key_states, value_states

    return Replayable


def checkpoint_layers(model, on: bool = True) -> None:
    """Gradient checkpointing of every decoder layer (non-reentrant), on or off. Each layer keeps only its input
    and recomputes the rest in the backward pass: the same loss and gradients. The layers may keep their cache
    argument, since :func:`batch_logprobs` gives them a cache that a second run does not change."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not on:
        base.gradient_checkpointing_disable()
        return
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in base.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module._can_checkpoint_with_cache = True


MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc maps each allocation apart, and unmaps it when freed (:func:`return_freed_memory`)."""


def return_freed_memory() -> None:
    """Have glibc give each freed tensor of a MiB or more back to the system at once (Linux; elsewhere nothing).

    glibc raises its threshold for a separate mapping to the largest block freed so far (up to 32 MiB), so after the
    first step a step's activations (blocks of 1-30 MiB) come from its heap, which fragments and is not given back:
    one step of the README's short run with checkpointing held 5.6-6.6 GB, 1.7-2.5 GB with a fixed threshold
    (128 KiB-4 MiB), which keeps the resident size near what is live. A mapping per large block costs page faults;
    on a busy 2-core machine the steps' times (100-130 s) did not tell them apart."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl, say): its own policy
        return
    mallopt(-3, MMAP_THRESHOLD)  # -3: M_MMAP_THRESHOLD in malloc.h
