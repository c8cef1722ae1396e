"""Running one epoch: the iterator the caller holds, where its batches come from (the main process or the
workers), and the samples left out of them."""
