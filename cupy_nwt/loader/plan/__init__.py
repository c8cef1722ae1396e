"""Planning an epoch: PyTorch's sampling arguments resolved, the order of the epoch's batches (the loader's own,
a user's sampler's, an iterable dataset's stream) and what is left of a resumed one. Pure: nothing here starts,
maps or waits."""
