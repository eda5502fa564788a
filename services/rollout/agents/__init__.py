"""Agents written against the OpenAI API as episodes (--environment agent): hub.py runs them,
http_api.py is the endpoint they talk to, episode.py turns their requests into a sample."""
