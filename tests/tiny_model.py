"""A tiny random llama model and a tokenizer trained on the spot from our own prompts (a few hundred KB)."""

from __future__ import annotations

from pathlib import Path

from negotiate.market import Market, Product, Buyer, SPLITS
from negotiate.protocol import SELLER
from negotiate.regulator import EpisodeState, observe

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def small_market(budget: int = 6) -> Market:
    return Market(
        spec=SPLITS["train"], seed=0,
        products=(Product("p1", "Air tent", 200, 1), Product("p2", "Pro tent", 300, 1)),
        buyers=(Buyer("b1", (500, 650), "neutral"), Buyer("b2", (450, 700), "neutral")),
        budget=budget, price_low=100, price_high=1000,
    )


def build_tiny_llama(folder: Path, extra_corpus: tuple[str, ...] = (), *, vocab: int = 400, seed: int = 0, hidden: int = 32,
                     heads: int = 4, kv_heads: int = 2) -> Path:
    """Save a 2-layer llama (hidden 32 by default) and a byte-level BPE tokenizer with a chat template into ``folder``.
    vLLM's attention needs a head size it supports (64 does: ``hidden=128, heads=2, kv_heads=1``)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from negotiate.agents.llm import render_buyer, render_seller

    torch.manual_seed(seed)
    state = EpisodeState(small_market())
    corpus = [m["content"] for m in render_seller(observe(state, SELLER), "tagged") + render_seller(observe(state, SELLER), "json")]
    corpus += [m["content"] for m in render_buyer(observe(state, "b1"), "tagged")]
    corpus += list(extra_corpus)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
