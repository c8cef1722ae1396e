"""Online tuning: the pure policy and the mechanism that listens to the loader's events."""
