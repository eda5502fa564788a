"""The rollout service's side of weight sync, one file per transport.

    receiver.py     InitWeightGroup and UpdateWeights for engines that load weights in process:
                    the sequence every transport shares (check the manifest, receive, verify,
                    [acknowledge], swap in, commit); `weight_receiver` chooses the kind once
    sglang.py       the same for engines whose own servers join the group and load the
                    weights (SGLang)
    requests.py     what both check of a request first, and their one-at-a-time rule
    base.py         the Receiver interface a transport implements, and what receivers share
    registry.py     the transport named in the manifest -> the kind of Receiver that takes it
    distributed.py  buckets broadcast by trainer rank 0 on the weight group, into staging buffers
    staging.py      the two sets of staging buffers an update lands in
    disk.py         safetensors files the trainer wrote, one per bucket

The trainer's side has the same layout (rollway.trainer.weight_sync), with the same file name
per transport; the protocol both sides speak (manifest, buckets, checksums, the group) is in
rollway.common.
"""
