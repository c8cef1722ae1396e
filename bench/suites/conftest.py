"""The suites time the shared workloads (``bench.workloads``) and the GPU feed study's loop: the repository
and that study's folder go on ``sys.path`` here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "studies" / "does_the_gpu_wait_for_batches"))
sys.path.insert(0, str(ROOT))
