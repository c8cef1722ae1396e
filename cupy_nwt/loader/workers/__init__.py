"""Making batches away from the caller: the messages, the batch maker, the one serve loop, and the
worker kinds (processes, threads) that run it, chosen from one registry."""
