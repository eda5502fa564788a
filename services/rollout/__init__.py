"""The rollway rollout service. Import nothing here: other services import rollway.rollout.v1 (protos) only."""
