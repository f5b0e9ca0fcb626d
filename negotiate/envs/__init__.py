"""Environment adapters: the market as an environment that other RL stacks load (PettingZoo, verifiers).

Nothing is imported here, so the package costs nothing without its extras: ``negotiate.envs.pettingzoo`` (extra
``envs``) and ``negotiate.envs.verifiers_env`` (extra ``verifiers``) each name their missing extra in one line.
``seats`` (agents played from outside an episode, and the driver that hands their questions out) and ``wire``
(observations and actions as text) need only the core install. docs/environments.md says how to use them.
"""
