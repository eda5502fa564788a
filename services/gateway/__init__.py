"""A Tinker-compatible HTTP API on rollway's services (`rollway gateway`).

A process of its own, beside the four services: like the coordinator it starts, supervises and
stops services (rollway.common.supervision's ServiceGroup) and owns what spans them: here,
per-tenant trainer and rollout services, sessions that release them, checkpoints by name. It
sizes a model's trainer with the run planner (rollway.coordinator.plan), so it refuses no model
that `rollway run` accepts; it imports nothing else of the coordinator.

    SDK (httpx) --HTTP--> app.py --> gateway.py (wires the parts; session calls, the watch)
                                 --> sessions.py (heartbeats; a silent session's models go)
                                 --> models.py (create: memory admission; training calls)
                                       --> tenants.py (one trainer ServiceGroup per model, or
                                                       one per LoRA base shared by its models)
                                 --> checkpoint_calls.py (save/load) --> checkpoints.py (records)
                                 --> sampling_sessions.py --> sampling.py --> base_rollouts.py
                                                         (one rollout service per base model)
                                 --> training_runs.py (the RestClient's listings)
                                 --> futures.py (each call runs in order on its model's thread;
                                                 retrieve_future polls it)
                                 <-> wire.py (the SDK's protobuf bodies <-> trainer protos)
"""
