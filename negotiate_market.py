"""The ``negotiate-market`` verifiers environment, by name: ``vf-eval negotiate-market`` and prime-rl import this module.

verifiers (0.4, ``verifiers.v1``) turns a taskset id into a top-level module name (``negotiate-market`` ->
``negotiate_market``) and takes the Taskset, Harness and Env subclasses this module's ``__all__`` exports, one of
each. They live in :mod:`negotiate.envs.verifiers_env`; this module only names them, so that installing negotiate
with the ``verifiers`` extra is all a shell needs (``vf-eval negotiate-market --model M --client.base-url URL``).
"""

from negotiate.envs.verifiers_env import TASKSET_ID, MarketEnv, MarketTaskset, MarketTasksetConfig, ViewHarness, load_environment

__all__ = ["MarketTaskset", "ViewHarness", "MarketEnv", "MarketTasksetConfig", "load_environment", "TASKSET_ID"]
