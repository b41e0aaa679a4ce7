"""Templar: permissionless LLM pre-training on Bittensor (DeMo + Gauntlet)."""

__version__ = "0.1.0"
