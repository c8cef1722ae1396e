"""The CUDA module's answers that need no GPU: link arithmetic, sysfs parsing, the probe itself."""

from __future__ import annotations

import pytest

from cupy_nwt import cuda


@pytest.mark.parametrize(
    ("gen", "width", "expected"),
    [(5, 16, 63.0), (4, 16, 31.5), (3, 16, 15.75), (3, 8, 7.88), (1, 1, 0.25), (2, 4, 2.0)],
)
def test_pcie_theoretical_gbps_matches_published_figures(gen, width, expected):
    assert cuda.pcie_theoretical_gbps(gen, width) == pytest.approx(expected, rel=5e-3)


@pytest.mark.parametrize(("gen", "width"), [(None, 16), (4, None), (9, 16), (4, 0)])
def test_pcie_theoretical_gbps_unknown_is_none(gen, width):
    assert cuda.pcie_theoretical_gbps(gen, width) is None


def test_sysfs_link_parsing(tmp_path):
    (tmp_path / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (tmp_path / "current_link_width").write_text("8\n")
    (tmp_path / "max_link_speed").write_text("32.0 GT/s PCIe\n")
    (tmp_path / "max_link_width").write_text("16\n")
    link = cuda.sysfs_pcie_link(tmp_path)
    assert (link.current_gen, link.current_width, link.max_gen, link.max_width) == (4, 8, 5, 16)
    assert link.max_gbps == pytest.approx(63.0, rel=5e-3)
    assert link.to_dict()["current_gbps"] == pytest.approx(15.75, rel=5e-3)


def test_sysfs_link_missing_is_none(tmp_path):
    assert cuda.sysfs_pcie_link(tmp_path / "nope") is None


def test_probe_never_raises_and_explains():
    status = cuda.gpu_status()
    if not status.available:
        assert status.reason and status.reason.startswith("no usable GPU") or "disabled" in status.reason
        with pytest.raises(cuda.NoGPUError, match=status.reason.split(":")[0]):
            cuda.require_gpu()
    assert status.to_dict()["available"] is status.available


@pytest.mark.gpu
def test_device_info_reports_link_and_engines():
    info = cuda.device_info(0)
    assert info.total_memory_bytes > 0 and info.copy_engines >= 1
    assert info.compute_capability.count(".") == 1


class _FakeDevices:
    """Stand-ins for device_scope and current_stream: default streams resolve against the current device."""

    def __init__(self, monkeypatch, current: int = 0) -> None:
        import contextlib

        self.current = current
        self.synced_on: list[int] = []
        fake = self

        @contextlib.contextmanager
        def device_scope(device):
            before, fake.current = fake.current, device
            try:
                yield
            finally:
                fake.current = before

        class NullStream:  # like cupy.cuda.Stream.null: device_id -1, handle 0 of whichever device is current
            def synchronize(self):
                fake.synced_on.append(fake.current)

        monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 2))
        monkeypatch.setattr(cuda, "device_scope", device_scope)
        monkeypatch.setattr(cuda, "current_stream", lambda: NullStream())


def test_stream_synchronizer_waits_with_its_device_current(monkeypatch):
    fake = _FakeDevices(monkeypatch, current=0)
    sync = cuda.stream_synchronizer(1)
    sync()
    sync()
    assert fake.synced_on == [1, 1]  # GPU 1's default stream, not GPU 0's
    assert fake.current == 0  # the caller's device is left alone
