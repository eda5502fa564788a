"""Deployment helpers: the Ray launcher (`rollway run --launcher ray`) and the compose demo steps."""
