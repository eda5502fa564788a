"""The OpenEnv host: a process that serves a user's OpenEnv app (server.py), started, watched
and restarted by the coordinator like the services; the rollout service talks to it over HTTP
(rollway.rollout.environments.openenv). It imports only rollway.common."""
