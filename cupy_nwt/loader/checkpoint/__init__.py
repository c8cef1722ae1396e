"""Where an epoch stands, saved and restored: the ledger of what was handed out, the state dict built from it and
checked field by field when loaded, and each reader's own dataset and iterator state."""
