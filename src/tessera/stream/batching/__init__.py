"""The sample order: which sample goes to which rank, worker and global batch, and how a run resumes.

Pure functions and small objects, no I/O and no torch (STYLE.md: the epoch plan apart from I/O):

- `mixing`: stream weights -> how many samples each stream and shard gives an epoch (units).
- `epoch_plan`: the units -> one epoch's lazy global sequence S (lanes, keyed block shuffle).
- `device_layout`: a global batch's positions -> ranks, a rank's batches -> DataLoader workers.
- `random_batches`, `stream_batches`, `device_per_stream`: the batching methods; `methods` picks one.
- `shard_needs`: a reader's samples in read order -> its shards in order of need (prefetch, eviction).
- `resume_state`: the state a run saves and the checks a resume makes.

Import from the modules themselves; this package's namespace is empty so that none of them imports it.
"""
