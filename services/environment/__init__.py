"""The Environment service: rollout's environments (rollway.rollout.environments) served over gRPC
by a process of their own (service.py), started and watched by the coordinator like the other
services; a rollout service reaches it through environments/remote.py. Of the rollout it imports
only the environments, its settings and its protos."""
