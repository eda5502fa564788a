"""Helpers shared by the tests: starting real services as processes, free ports, certificates."""
