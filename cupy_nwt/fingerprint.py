"""Old home of :mod:`cupy_nwt.nwt.fingerprint`, kept for one release.

This module puts its new home in its place in ``sys.modules``, so both names are one module object:
everything is there under the old name, and setting a name through either reaches every user.
"""

from __future__ import annotations

import sys

from .nwt import fingerprint as _home

sys.modules[__name__] = _home
