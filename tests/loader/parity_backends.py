"""The two loaders the parity tests run side by side: cupy_nwt's and, where torch is installed, torch's.

``tests/loader/conftest.py`` makes ``backend`` a fixture of the loader's tests; ``is_torch`` tells which
loader a case got. torch's loader has no thread workers, so its cases run once, beside cupy_nwt's
process workers.
"""

import pytest

try:
    import torch.utils.data as tud
except ImportError:
    tud = None

BACKENDS = ["cupy_nwt", pytest.param("torch", marks=pytest.mark.skipif(tud is None, reason="torch is not installed"))]


def is_torch(backend) -> bool:
    return tud is not None and backend is tud.DataLoader
