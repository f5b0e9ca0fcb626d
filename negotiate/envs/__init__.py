"""Environment adapters: the market as an environment that other RL stacks load (PettingZoo, verifiers)."""
