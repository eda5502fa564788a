"""The trainer's side of weight sync, one file per transport.

    pusher.py       InitWeightGroup and PushWeights on rank 0: checks, versions, timings, the
                    sequence every transport shares; the run's sender
    base.py         the Sender interface a transport implements, the bucket layout and the
                    checksum pass every manifest carries
    registry.py     the transport named in the request -> its kind of Sender
    passes.py       what every trainer rank runs for a push (the WeightPass command,
                    trainer/commands.py): the step's type chooses the pass
    distributed.py  the run's DistributedSender (its weight group and buffers); rank 0
                    broadcasts buckets on the group (SGLang servers receive these too: the
                    trainer's side has no SGLang-specific code)
    disk.py         rank 0 writes one safetensors file per bucket
    gather.py       every rank sends its byte ranges of a bucket into rank 0's buffer

The rollout service's side has the same layout (rollway.rollout.weight_sync), with the same file
name per transport; the protocol both sides speak (manifest, buckets, checksums, the group) is
in rollway.common.
"""
