"""The seller policy's settings: what the model is shown and how its reply is decoded, as one typed value.

A :class:`Policy` names the prompt view (``negotiate.agents.views``: the view declares the scripted advisers it
shows), the reply's format, the constraints it is decoded under (``legal``, ``grounded``), the sampling temperature,
the reply's token budget and the re-asks. It is parsed once, from an agent spec's keys (:meth:`Policy.of` reads a
parsed ``openai:``, ``hf:`` or ``vllm:`` spec) or from a TOML table or config fields (:meth:`Policy.from_mapping`),
checked once (:meth:`Policy.check`, errors naming the field), and passed by value: the served seller is built from
it (``negotiate.agents.registry.policy_seller``; ``negotiate.agents.llm.LLMSeller`` holds it), the loop writes it into
the spec its server's sellers play (:meth:`Policy.query`), and the trainer renders its data and plays its evaluations
through the same view.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from negotiate.errors import UserError

from negotiate.agents.contract import FORMATS
from negotiate.agents.views import PROMPTS, VIEWS, View

__all__ = ["Policy", "FORMATS"]


@dataclass(frozen=True)
class Policy:
    """What the seller model sees and how its reply is decoded."""

    prompt: str = "full"
    """The prompt view's name (``negotiate.agents.views.VIEWS``): ``full``, ``compact``, ``facts``, ``advice``, ``tools``."""
    format: str = "json"
    """``json`` (the four-part schema; the full view only) or ``tagged`` (``Thought:/To:/Talk:/Action:``), as in a spec."""
    legal: bool = False
    """Decode the tagged reply under a regex of the replies the rules allow now (a vLLM server's structured outputs)."""
    grounded: bool = False
    """With ``legal``, in a view that grounds (``facts``, ``advice``): the thought is a reason stating the prompt's facts."""
    temperature: float = 0.7
    """Sampling temperature, 0 (greedy) to 2."""
    max_tokens: int = 96
    """The most tokens a reply may take."""
    reask: int = 0
    """Re-asks after an unparseable reply, with the error."""

    @property
    def view(self) -> View:
        """The prompt view (``negotiate.agents.views``)."""
        return VIEWS[self.prompt]

    @property
    def tools(self) -> tuple[str, ...]:
        """The scripted sellers whose next messages the prompt shows (its advisers), as the view declares them."""
        return self.view.tools

    @classmethod
    def of(cls, options) -> Policy:
        """The policy of a parsed model spec's options (``OpenAIOptions``, ``HFOptions`` or ``VLLMOptions``)."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)})

    @classmethod
    def from_mapping(cls, values: dict, *, source: str | None = None, flag=lambda name: f"--{name.replace('_', '-')}") -> Policy:
        """The policy of a TOML table or a config's fields (unknown keys ignored: a config holds more than the policy),
        checked; an error names ``source`` and the key, or the flag ``flag(key)``."""
        policy = cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
        policy.check(source=source, flag=flag)
        return policy

    def check(self, *, role: str = "seller", server: str | None = None, source: str | None = None, field: str | None = None,
              value=None, flag=lambda name: f"--{name.replace('_', '-')}") -> None:
        """One-line :class:`UserError` for settings out of range or that cannot go together, in the spec's words
        (``legal=1``, ``format=tagged``). It names ``field`` and ``value`` where given (the spec's flag and text), else
        the key in ``source`` (a TOML file), else the flag ``flag(key)``. ``server``: the spec's server kind, where it
        is known (``legal`` needs vLLM's structured outputs)."""

        def fail(name: str, message: str, bad) -> UserError:
            if field is not None:
                return UserError(message, field=field, value=value)
            return UserError(message, source=source, field=name if source else flag(name), value=bad)

        if self.prompt not in PROMPTS:
            raise fail("prompt", f"choose from {', '.join(PROMPTS)}", self.prompt)
        if self.format not in FORMATS:
            raise fail("format", f"choose from {', '.join(FORMATS)}", self.format)
        if not 0 <= self.temperature <= 2:
            raise fail("temperature", "must be from 0 to 2 (0: greedy)", self.temperature)
        if self.max_tokens < 1:
            raise fail("max_tokens", "must be at least 1", self.max_tokens)
        if self.reask < 0:
            raise fail("reask", "must be 0 or more", self.reask)
        view = self.view
        if self.prompt != "full" and role != "seller":
            raise fail("prompt", f"prompt={self.prompt} is a seller's prompt; a buyer's prompt is always the full one", self.prompt)
        if view.chooses and server not in (None, "vllm", "auto"):
            raise fail("prompt", f"prompt={self.prompt} reads a letter decoded under a regex of the menu's letters: it needs a local "
                                 f"model (hf:) or vLLM (a vLLM server, or vllm:); server={server}", self.prompt)
        if view.tagged and self.format != "tagged":
            raise fail("format", f"prompt={self.prompt} asks for tagged replies; add format=tagged", self.format)
        if self.grounded and not (self.legal and view.grounds):
            first, *others = [name for name, v in VIEWS.items() if v.grounds]
            also = "".join(f" (or prompt={name})" for name in others)
            raise fail("grounded", f"grounded=1 binds the thought to the facts prompt under legal=1; add legal=1&prompt={first}{also}",
                       True)
        if not self.legal:
            return
        if role != "seller":
            raise fail("legal", "legal=1 constrains the seller's replies; a buyer's are judged by the regulator's buyer guard", True)
        if self.format != "tagged":
            raise fail("legal", "legal=1 constrains the tagged form; add format=tagged", True)
        if server not in (None, "vllm", "auto"):
            raise fail("legal", f"legal=1 needs a vLLM server (its structured_outputs regex); server={server}", True)

    def query(self, server: str | None = None, **client) -> str:
        """The policy as agent-spec keys, with a client's where given (``server``, then the others in the order given):
        what the loop appends to the spec of the model its server serves (``training/loop/stages.py``). The format, the
        temperature and the token budget are always written; the decoding constraints, the prompt view and the re-asks
        only where they are not the defaults, last. That is the order the loop has always written its specs in: they
        name its trace files, which a resumed loop finds again.

        >>> Policy(prompt="facts", format="tagged", legal=True, temperature=1.0, max_tokens=48).query("vllm", logprobs=1)
        'format=tagged&server=vllm&temperature=1.0&max_tokens=48&logprobs=1&legal=1&prompt=facts'
        >>> Policy().query()
        'format=json&temperature=0.7&max_tokens=96'
        """
        default = Policy()
        keys = {"format": self.format, "server": server, "temperature": self.temperature, "max_tokens": self.max_tokens, **client}
        keys |= {name: getattr(self, name) for name in ("legal", "grounded", "prompt", "reask")
                 if getattr(self, name) != getattr(default, name)}
        return "&".join(f"{name}={int(value) if isinstance(value, bool) else value}" for name, value in keys.items()
                        if value is not None)

    def to_json(self) -> dict:
        return asdict(self)
