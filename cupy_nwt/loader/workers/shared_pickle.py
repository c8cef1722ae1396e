"""What a forkserver or spawn worker is sent, with its large arrays in memory the workers share.

Under fork a worker inherits the dataset copy-on-write. Under forkserver and spawn (forkserver is
the default once CUDA is live) the process object is pickled for each worker, dataset included: an
in-memory dataset of CIFAR-10's size (154 MB) pickled, piped and unpickled once per worker, one
worker after another in the main process, costs seconds at 8 workers and leaves each worker a copy
of its own. So pickle protocol 5 hands every large contiguous buffer out of band; its bytes
are written once into an anonymous shared file (memfd) and each worker maps that file
copy-on-write, rebuilding the object over the mapping: the pickle that travels is small, and the
pages stay shared until a worker writes to them, as after a fork.

A large pickle of the rest (a sample list of a million paths) is made once for the workers started
together and goes into the file too, unless a reducer handed one worker a descriptor. A buffer is written again only if its bytes changed since (a worker started later sees
the array as it is then, as a forked one would). Where memfd is missing, or the file cannot grow,
everything travels in the pickle, once per worker.

A ``np.memmap`` pickles its whole content in band, whatever the protocol: a dataset class holding a
memmap of a file larger than memory would be read whole and sent to every worker. A memmap of a
file's content travels as that file's name and place instead, and is mapped again in the worker,
sharing the file's pages as a fork would, once the worker has checked the file is still the one the
main process maps (``cupy_nwt._mapped_files``).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
from dataclasses import dataclass
from multiprocessing import context, reduction
from typing import Any, TypeVar, cast

import numpy as np

from ..._mapped_files import ProcessMaps, checked_together, mapped_file, open_mapped
from ...errors import CupyNwtError
from ...system import memory_room
from .messages import ErrorReport

T = TypeVar("T")
OUT_OF_BAND_BYTES = 1 << 20  # smaller buffers stay in the pickle: writing and comparing them saves nothing
PRIVATE_COPY_BYTES = 16 << 20  # Python objects pickled in band past this: each worker's own copy is worth a line
MEMFD_NAME = "cupy_nwt-worker-arrays"  # not the rings' "cupy_nwt_" prefix: ``live_segments`` counts rings only


class SharedPickles:
    """One worker pool's shared file of out-of-band buffers; ``wrap`` marks what is pickled through it."""

    def __init__(self, script: str | None = None, script_needed: bool = False) -> None:
        self.script = script  # run in a worker whose forkserver stood in for it (``server_main``) if needed
        self.script_needed = script_needed  # something pickled beside the object (worker_init_fn) is the script's
        self._fd = -1
        self._size = 0
        self._placed: dict[tuple[int, int], int] = {}  # (address, nbytes) of a source buffer -> its offset
        self._view: mmap.mmap | None = None  # the file, read back to compare
        self._object_bytes = 0  # the most bytes of Python objects in one pickle a worker unpickles into its own copy
        try:
            self._fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            pass

    def wrap(self, obj: T) -> T:
        """``obj`` itself where nothing can be shared; else a stand-in that unpickles as ``obj``.

        Workers started with one stand-in, one after another, share its buffers as first written;
        a new stand-in compares them with the bytes as they are then.
        """
        return obj if self._fd < 0 and self.script is None else cast(T, _Shared(obj, self))

    def place(self, buf: memoryview) -> int | None:
        """The offset of ``buf``'s bytes in the file, written unless an equal copy is there; None: keep it in band."""
        if self._fd < 0:
            return None  # no shared file (memfd missing): in band
        key = (_address(buf), buf.nbytes)
        offset = self._placed.get(key)
        if offset is not None and self._equal(offset, buf):
            return offset
        if buf.nbytes > memory_room().bytes:
            return None  # too large to hold once more: in band, as before, a copy in each worker
        offset = -(-self._size // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            os.ftruncate(self._fd, offset + buf.nbytes)
            written = os.pwrite(self._fd, buf, offset)
            while written < buf.nbytes:
                written += os.pwrite(self._fd, buf[written:], offset + written)
        except OSError:
            os.ftruncate(self._fd, self._size)
            return None
        self._size = offset + buf.nbytes
        self._placed[key] = offset
        return offset

    def _equal(self, offset: int, buf: memoryview) -> bool:
        if self._view is None or len(self._view) < self._size:
            if self._view is not None:
                self._view.close()
            self._view = mmap.mmap(self._fd, self._size, prot=mmap.PROT_READ)  # kept: its pages fault in once
        stored, now = np.frombuffer(self._view, np.uint8, buf.nbytes, offset), np.frombuffer(buf, np.uint8)
        step = 1 << 22  # in pieces: one comparison of the whole would allocate a bool per byte
        same = all(np.array_equal(stored[i:i + step], now[i:i + step]) for i in range(0, buf.nbytes, step))
        del stored  # the mapping can close only once no array views it
        return same

    def note_objects(self, nbytes: int) -> None:
        """Record the bytes of Python objects (not array data) in a pickle the workers unpickle each."""
        self._object_bytes = max(self._object_bytes, nbytes)

    def private_copy_advice(self, method: str) -> str | None:
        """A line for the user when each worker rebuilds a large pickle of Python objects on its own.

        A list of a million sample paths is tens of MB pickled: every forkserver or spawn worker
        unpickles it (the start study's 1.2-million list: 232 MiB a worker), where arrays are mapped
        once for all. torch's contract keeps a list a list, so only the user can change it."""
        if self._object_bytes < PRIVATE_COPY_BYTES:
            return None
        return (f"each {method} worker unpickles {self._object_bytes / 1e6:.0f} MB of the dataset's Python objects and keeps "
                f"a copy of its own (a later first batch, that memory again in every worker); keep a large index in "
                f"NumPy arrays, which the workers share (a list of dicts: cupy_nwt.pack_records(records))")

    @property
    def size(self) -> int:
        return self._size

    @property
    def fd(self) -> int:
        return self._fd

    def close(self) -> None:
        """Close the main process's descriptor; the workers' mappings keep the memory. Idempotent."""
        fd, self._fd = self._fd, -1
        if self._view is not None:
            self._view.close()
            self._view = None
        if fd >= 0:
            os.close(fd)


def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, np.uint8).ctypes.data) if buf.nbytes else 0


class _Shared:
    """Pickles as ``obj`` with its large buffers placed in ``pickles``' file (pickled only while a worker starts).

    The object is pickled once for all the workers started with this stand-in, its pickle written
    into the file beside its buffers, unless a reducer tied the pickle to one worker by handing that
    worker a descriptor (a ``multiprocessing.Value``, a ``Connection``): a list of a million sample
    paths costs most of a second to pickle, which the main process paid once per worker.
    """

    def __init__(self, obj: Any, pickles: SharedPickles) -> None:
        self.obj, self.pickles = obj, pickles
        self.placed: dict[tuple[int, int], int] = {}  # this stand-in's buffers: workers started together share them
        self.whole: tuple[tuple[int, int], list[tuple[int, int, bool]]] | None = None  # pickle, buffers: in the file
        self.script: str | None = None  # the script's path when the pickle names something of it

    def __reduce__(self) -> tuple[Any, ...]:
        if self.whole is None:
            data, regions, tied, array_bytes = self._pickle()
            self.pickles.note_objects(len(data) - array_bytes)
            scripted = self.pickles.script_needed or any(name in data for name in (b"__main__", b"__mp_main__"))
            self.script = self.pickles.script if scripted else None  # a string that merely says __main__: run it anyway
            where = None if tied or len(data) < OUT_OF_BAND_BYTES else self.pickles.place(memoryview(data))
            if where is None:
                fd = reduction.DupFd(self.pickles.fd) if regions else None
                return _loads, (data, fd, self.pickles.size, regions, None, self.script)
            self.whole = (where, len(data)), regions
        blob, regions = self.whole
        return _loads, (None, reduction.DupFd(self.pickles.fd), self.pickles.size, regions, blob, self.script)

    def _pickle(self) -> tuple[bytes, list[tuple[int, int, bool]], bool, int]:
        """The pickle, its out-of-band buffers' (offset, nbytes, readonly) in order, whether a reducer
        passed a descriptor to the worker being started (which makes the pickle that worker's only), and
        the bytes of array data left in band (small arrays, a copy-on-write memmap's content)."""
        regions: list[tuple[int, int, bool]] = []
        array_bytes = 0

        def out_of_band(pb: pickle.PickleBuffer) -> bool:
            nonlocal array_bytes
            raw = pb.raw()
            if raw.nbytes < OUT_OF_BAND_BYTES:
                array_bytes += raw.nbytes
                return True
            key = (_address(raw), raw.nbytes)
            offset = self.placed.get(key)
            if offset is None:
                offset = self.pickles.place(raw)
                if offset is None:
                    array_bytes += raw.nbytes
                    return True
                self.placed[key] = offset
            regions.append((offset, raw.nbytes, raw.readonly))
            return False

        maps = ProcessMaps()  # one reading of this process's mappings for every memmap of this pickle

        def memmap_in_band(a: np.memmap[Any, np.dtype[Any]]) -> Any:
            nonlocal array_bytes
            reduced = _reduce_memmap(a, maps)
            if reduced[0] is not open_mapped:
                array_bytes += a.nbytes  # its bytes, in band
            return reduced

        popen = context.get_spawning_popen()
        passed: list[int] = []
        if popen is not None:
            handed = popen.duplicate_for_child

            def counted(fd: int) -> Any:
                passed.append(fd)
                return handed(fd)

            setattr(popen, "duplicate_for_child", counted)  # this pickle only: the popen's own method again below
        data = io.BytesIO()
        try:
            pickler = pickle.Pickler(data, 5, buffer_callback=out_of_band)
            table = reduction.ForkingPickler(io.BytesIO(), 5).dispatch_table  # fd and lock reducers
            table[np.memmap] = memmap_in_band
            pickler.dispatch_table = table
            pickler.dump(self.obj)
        finally:
            if popen is not None:
                del popen.duplicate_for_child
        return data.getvalue(), regions, popen is None or bool(passed), array_bytes


def _reduce_memmap(a: np.memmap[Any, np.dtype[Any]], maps: ProcessMaps) -> Any:
    """A memmap as the file it maps, to map again (``_mapped_files``); else as NumPy pickles it (its bytes, in band)."""
    place = mapped_file(a, maps)
    return (open_mapped, (place,)) if place is not None else a.__reduce_ex__(5)


def _loads(data: bytes | None, dup: Any, size: int, regions: list[tuple[int, int, bool]],
           blob: tuple[int, int] | None, script: str | None = None) -> Any:
    """In the worker: map the shared file copy-on-write and rebuild the object over it (after running
    the script, when the object needs it and the forkserver's server did not import it)."""
    if script is not None:
        from .server_main import import_script  # noqa: PLC0415 - importing it acts in the server only

        import_script(script)
    try:
        if dup is None:
            with checked_together():
                return pickle.loads(data or b"")
        fd = dup.detach()
        try:
            memory = memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
        finally:
            os.close(fd)
        buffers = [memory[o:o + n].toreadonly() if ro else memory[o:o + n] for o, n, ro in regions]
        whole: bytes | memoryview = memory[blob[0]:blob[0] + blob[1]] if blob is not None else (data or b"")
        with checked_together():
            return pickle.loads(whole, buffers=buffers)
    except CupyNwtError as exc:  # a deliberate refusal (a data file changed since): the caller's, in one line
        return Unloaded(ErrorReport.from_exception(exc, None))


@dataclass(frozen=True)
class Unloaded:
    """What a worker holds instead of the object it was sent when rebuilding it raised a deliberate error."""

    report: ErrorReport
