"""Where batches land: the device a loader resolves to and the prefetcher that copies to it."""
