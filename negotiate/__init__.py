"""negotiate: a runtime for multi-item bargaining between LLM, scripted and human agents.

Dataflow: market spec -> episode (task group) -> bus (turn budget, regulator) ->
agents -> four-part messages -> trace (JSONL) -> metrics and rewards.
"""

from importlib import import_module

_HOME = {
    "SCHEMA_VERSION": "episode", "Episode": "episode", "run_episode": "episode",
    "UserError": "errors",
    "SPLITS": "market", "Buyer": "market", "Market": "market", "MarketSpec": "market", "Product": "market",
    "generate": "market", "load_spec": "market",
    "episode_metrics": "metrics", "metrics_from_events": "metrics", "opt": "metrics",
    "Action": "protocol", "Generated": "protocol", "Message": "protocol", "Notice": "protocol",
    "ParseFailure": "protocol", "json_schema": "protocol", "parse": "protocol", "render_tagged": "protocol",
    "BuyerObservation": "regulator", "EpisodeState": "regulator", "SellerObservation": "regulator", "observe": "regulator",
    "TraceWriter": "trace", "read_episodes": "trace",
}
"""Where each public name lives. Imported on first use (PEP 562), so that ``negotiate``'s command line can
catch a Ctrl-C that comes while its modules load (scipy alone takes most of a second)."""


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(import_module(f"negotiate.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    try:
        return import_module(f"negotiate.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"negotiate.{name}":
            raise
        raise AttributeError(f"module 'negotiate' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


__all__ = [
    "Action",
    "Buyer",
    "BuyerObservation",
    "Episode",
    "EpisodeState",
    "Generated",
    "Market",
    "MarketSpec",
    "Message",
    "Notice",
    "ParseFailure",
    "Product",
    "SCHEMA_VERSION",
    "SPLITS",
    "SellerObservation",
    "TraceWriter",
    "UserError",
    "episode_metrics",
    "generate",
    "json_schema",
    "load_spec",
    "metrics_from_events",
    "observe",
    "opt",
    "parse",
    "read_episodes",
    "render_tagged",
    "run_episode",
]
__version__ = "0.1.0"
