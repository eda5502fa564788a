"""The OpenAI-compatible endpoint that agents' episodes talk to (--environment agent): http_api.py
serves /v1/chat/completions and /v1/completions, policy_api.py answers them from the policy
(token-in, token-out), chat_format.py renders and checks their messages. The agent environment
that runs the agents and turns their requests into samples is environments/agent.py (episodes)
and environments/agent_hub.py (launching agents, routing requests to their episodes)."""
