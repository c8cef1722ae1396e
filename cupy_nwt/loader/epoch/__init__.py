"""One epoch: its plan (sampler, remainder of a resumed epoch), where its batches come from, the
iterator the caller holds and the state it saves."""
