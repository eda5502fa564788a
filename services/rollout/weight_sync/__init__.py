"""The rollout service's side of weight sync, one file per transport.

    receiver.py     InitWeightGroup and UpdateWeights: the sequence every transport shares
                    (check the manifest, receive, verify, [acknowledge], swap in, commit)
    base.py         the Receiver interface a transport implements, and what receivers share
    registry.py     the transport named in the manifest -> its Receiver
    distributed.py  buckets broadcast by trainer rank 0 on the weight group, into staging buffers
    disk.py         safetensors files the trainer wrote, one per bucket
    sglang.py       engines whose own servers join the group and load the weights (SGLang)

The trainer's side has the same layout (rollway.trainer.weight_sync), with the same file name
per transport; the protocol both sides speak (manifest, buckets, checksums, the group) is in
rollway.common.
"""
