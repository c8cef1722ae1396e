"""The loader's base error, in a module of its own so that the ring (shm) and the workers share it."""


class LoaderError(RuntimeError):
    """Base class of the loader's own errors."""
