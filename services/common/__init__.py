"""Shared runtime of the rollway services: server bootstrap, interceptors, logging, tracing, config, clients."""
