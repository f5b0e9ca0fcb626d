"""negotiate: a runtime for multi-item bargaining between LLM, scripted and human agents.

Dataflow: market spec -> episode (task group) -> bus (turn budget, regulator) ->
agents -> four-part messages -> trace (JSONL) -> metrics and rewards.
"""

from negotiate.episode import SCHEMA_VERSION, Episode, run_episode
from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product, generate, load_spec
from negotiate.metrics import episode_metrics, metrics_from_events, opt
from negotiate.protocol import Action, Generated, Message, Notice, ParseFailure, json_schema, parse, render_tagged
from negotiate.regulator import BuyerObservation, EpisodeState, SellerObservation, observe
from negotiate.trace import TraceWriter, read_episodes

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
