"""Operator tools behind `templar` subcommands."""
