"""The weight-sync protocol both sides speak (rollway.trainer.weight_sync sends,
rollway.rollout.weight_sync receives, the coordinator drives the sequence).

    transports.py       the transports of the protocol (torch-free: the coordinator reads it)
    buckets.py          the bucket layout and the manifest
    bucket_checksum.py  the per-bucket checksum every byte that moves is verified against
    group.py            the weight group: trainer rank 0 plus every engine worker
    group_proof.py      members prove the run's secret before any weights move
"""
