"""`streaming.base.batching.generate_work`: MosaicML's per-worker sample partition array; Tessera plans
batches differently (tessera.stream.batching) and has no such array."""

from streaming.base.missing import missing

generate_work = missing("generate_work")
