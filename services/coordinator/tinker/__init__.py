"""A Tinker-compatible HTTP API on rollway's services (`rollway gateway`).

It lives in the coordinator because the coordinator is the process that starts, supervises and
stops services (only it may use rollway.common.supervision's ServiceGroup) and owns what spans them: here,
per-tenant trainer and rollout services, sessions that release them, checkpoints by name.

    SDK (httpx) --HTTP--> app.py --> sessions.py (heartbeats; a silent session's models go)
                                 --> tenants.py (one trainer [+ rollout] ServiceGroup per model)
                                 --> futures.py (each call runs in order on its model's thread;
                                                 retrieve_future polls it)
                                 <-> wire.py (the SDK's protobuf bodies <-> trainer protos)
"""
