"""agentrl: reinforcement learning for multi-turn LLM agents (see README.md for the dataflow)."""
