"""YAML presets of agentrl's config schema (agentrl/config.py), shipped as package data."""
