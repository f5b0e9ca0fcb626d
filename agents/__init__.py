"""Agents: scripted strategies (and, beside them, model-backed and human agents)."""

from negotiate.agents.base import BuyerAgent, ScriptedAgent, SellerAgent
from negotiate.agents.registry import AgentSpec, parse_agent
from negotiate.agents.scripted import BUYERS, SELLERS

__all__ = ["AgentSpec", "BUYERS", "BuyerAgent", "SELLERS", "ScriptedAgent", "SellerAgent", "parse_agent"]
