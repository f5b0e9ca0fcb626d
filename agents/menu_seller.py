"""The menu seller: a model that picks one of the legal moves the runtime lays out (``prompt=menu``).

At each decision the menu's tools (the planner and greedy) propose their moves, :func:`~negotiate.agents.menu.build_menu`
lays out the menu, and the model reads :func:`~negotiate.agents.menu.render_menu`'s prompt and answers with a letter.
The letter is read from the model's log-probs over the menu's letters, not parsed from text, so every move it makes is
legal (valid 1.000 by construction, but for the race of two buyers for one last unit), and one forward pass decides:

- ``hf:`` (a local model): one forward pass over the prompt, the menu's letters' logits at its last position, the
  choice sampled at the spec's temperature (the argmax at 0); the trace keeps every option's log-prob;
- ``openai:`` and ``vllm:`` (a vLLM server, or vLLM in this process): the reply is decoded under a regex of the menu's
  letters (vLLM's structured outputs), one token; the trace keeps the chosen letter's log-prob as the server gives it.

The message sent is the option's, with a thought naming the option and a talk from a template
(:meth:`~negotiate.agents.menu.Menu.message`). Its trace event's ``extra`` keeps what a trainer reads: the prompt, the
menu's lines (``options``), the ``choice`` (its index), its ``logprob`` and, where the backend gives them, the
``probs`` of every option. A menu of one option (only ``end``) is sent without asking the model.
"""

from __future__ import annotations

import math

from negotiate.protocol import SELLER, Generated, ParseFailure
from negotiate.regulator import SellerObservation

from negotiate.agents.llm import LLMSeller
from negotiate.agents.menu import LETTERS, Menu, render_menu

__all__ = ["MenuSeller", "letter_pattern"]


def letter_pattern(menu: Menu) -> str:
    """The regex of a reply that is one of ``menu``'s letters (vLLM's structured outputs decode under it).

    >>> from negotiate.agents.menu import Move, Option
    >>> letter_pattern(Menu((Option(Move("end")), Option(Move("wait")), Option(Move("end")))))
    '[ABC]'
    """
    return f"[{menu.letters}]"


class MenuSeller(LLMSeller):
    """A seller that answers each decision with one letter of the menu (``prompt=menu``)."""

    async def _act(self, obs: SellerObservation) -> Generated:
        menu = self.view.menu(obs, self.adviser.advise(obs))
        messages = render_menu(obs, menu)
        seed = None if self._seed is None else (self._seed + self._calls) % (2**31 - 1)
        self._calls += 1
        extra: dict = {"backend": self.backend.name, "format": "menu", "prompt": messages, "options": menu.lines()}
        if seed is not None:
            extra["seed"] = seed
        if len(menu) == 1:
            extra |= {"choice": 0, "logprob": 0.0, "probs": [1.0], "asked": False}
            return Generated(menu.message(0), LETTERS[0], extra)
        choose = getattr(self.backend, "choose", None)
        if choose is not None:  # a local model: one forward pass, every option's log-prob
            chosen = await choose(messages, menu.letters, seed=seed)
            index, logprobs = chosen.index, chosen.logprobs
            extra |= {"latency_s": round(chosen.seconds, 6), "batch": chosen.batch, "prompt_token_ids": chosen.prompt_ids,
                      "probs": [round(math.exp(x), 6) for x in logprobs]}
            logprob = logprobs[index]
        else:  # a server: one token under the letters' regex
            completion = await self.backend.complete(messages, role=SELLER, seed=seed, constraint=letter_pattern(menu))
            extra |= completion.trace()
            text = completion.text.strip()
            if len(text) != 1 or text not in menu.letters:
                reason = f"the reply {text[:40]!r} is not one of the menu's letters {menu.letters} (is the server vLLM?)"
                return Generated(ParseFailure(reason, completion.text), completion.text, extra)
            index = menu.letters.index(text)
            logprob = completion.logprobs[0] if completion.logprobs else None
        extra |= {"choice": index, "logprob": logprob}
        return Generated(menu.message(index), LETTERS[index], extra)

