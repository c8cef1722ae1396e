"""The shared-memory ring: its layout and segment, the slot pool that owns its free list and generation,
and how a batch is collated into a slot and cut into arrays and other leaves."""
