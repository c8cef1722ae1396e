"""The suites time the workloads two studies define: those studies' folders go on ``sys.path`` here."""

from __future__ import annotations

import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[1] / "studies"
for study in ("is_the_loader_faster_than_torch", "does_the_gpu_wait_for_batches"):
    sys.path.insert(0, str(STUDIES / study))
