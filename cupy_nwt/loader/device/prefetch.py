"""Host batches -> device batches, with the copy of batch n+1 in flight while batch n is used.

The copies run on a side stream. A batch is handed out only after the consumer's current stream has
been told to wait on the copy's event, so the consumer's kernels are ordered after the copy without
blocking the host. The ring slot a copy reads from goes back to the workers only once that copy's
event has completed.

Where the bytes come from (``pin_path``):

* ``"registered"``: the whole ring was page-locked once with cudaHostRegister; copies start straight
  from the slot, truly asynchronously. No extra host copy.
* ``"staging"``: registration was refused (or asked for); each batch is first copied into one of a few
  pinned staging buffers (one host memcpy), the slot is released at once, and the H2D copy is async.
* ``"none"``: ``pin_memory=False``; the copy reads pageable memory, which the driver stages itself and
  which is therefore synchronous with respect to the host.

A batch outside the ring (one made before the ring existed, or one that did not fit its layout) is
copied from its own pageable arrays; its leaves that are not arrays are handed out as they are.

A copy that cannot be issued (out of memory, a CUDA error) fails its own batch, in its turn, in one line,
as a worker's failed batch does, and the epoch goes on; when not even the side stream can be waited for
any more, the device is unusable and the epoch ends with that first error.

The device arrays are CuPy's; a batch whose samples held torch tensors (or JAX arrays), or an
``output`` that asks for them, is handed over through DLPack, without a copy. That happens only
after the consumer's stream was told to wait on the copy, so a consumer on another stream of its
framework is ordered after the copy by DLPack's own stream handshake.

Device arrays are allocated from the pool of the consumer's stream, and the side stream waits on that
stream before writing them: memory a previous batch freed while the consumer still had kernels queued
on it is never overwritten early. A batch handed to torch is used on torch's current stream, which may
be another (``torch.cuda.stream(s)``): a tensor the host drops gives its memory back to that pool at
once, whatever torch still has queued, so the side stream waits on torch's current stream too.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ... import cuda
from ...errors import RunError, WorkerError, as_worker_error
from .._events import Listener
from ..ring.ring import Ring, SlotLayout
from ..ring.slots import BatchSource, FailedBatch, HostBatch, unjoinable
from ..ring.tree import OutputTree, join, leaf_frameworks

STAGING_BUFFERS = 3


class Registration(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class PrefetchOps(Protocol):
    """Exactly the CUDA operations the prefetcher uses; streams, events and device arrays are opaque.

    ``CudaOps`` is the real one; a loader takes another through ``LoaderParts(ops=...)`` (the tests
    give it a fake that runs copies late). ``device_count`` and ``device_scope`` stand for the GPUs
    the loader may pick from and make current. ``framework_stream`` is the stream a framework a batch is
    handed to (torch) runs its kernels on now, where that is not ``current_stream()`` (None: the same one,
    or not known).
    """

    def device_count(self) -> int: ...
    def device_scope(self, device_id: int) -> AbstractContextManager[Any]: ...

    def current_stream(self) -> Any: ...
    def framework_stream(self, framework: str) -> Any: ...
    def new_stream(self) -> Any: ...
    def record(self, stream: Any) -> Any: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def done(self, event: Any) -> bool: ...
    def sync(self, event: Any) -> None: ...
    def empty(self, shape: tuple[int, ...], dtype: np.dtype, stream: Any) -> Any: ...
    def h2d(self, dst: Any, src: np.ndarray, stream: Any) -> None: ...
    def register(self, buffer: np.ndarray) -> Registration: ...
    def pinned(self, nbytes: int) -> np.ndarray: ...


class CudaOps(PrefetchOps):
    """The prefetcher's CUDA operations, all through ``cupy_nwt.cuda``."""

    def device_count(self) -> int:
        cuda.require_gpu()
        return cuda.device_count()

    def device_scope(self, device_id: int) -> AbstractContextManager[Any]:
        return cuda.device_scope(device_id)

    def current_stream(self) -> Any:
        return cuda.current_stream()

    def framework_stream(self, framework: str) -> Any:
        return cuda.framework_stream(framework, cuda.current_device())

    def new_stream(self) -> Any:
        return cuda.stream(non_blocking=True)

    def record(self, stream: Any) -> Any:
        return stream.record()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def sync(self, event: Any) -> None:
        event.synchronize()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, stream: Any) -> Any:
        return cuda.device_empty(shape, dtype, stream)

    def h2d(self, dst: Any, src: np.ndarray, stream: Any) -> None:
        cuda.memcpy_h2d(dst, src, stream)

    def register(self, buffer: np.ndarray) -> Registration:
        return cuda.HostRegistration(buffer)

    def pinned(self, nbytes: int) -> np.ndarray:
        return cuda.pinned_empty(nbytes, np.uint8)


@dataclass
class _Copy:
    batch: Any  # (treedef, device arrays, objects, batch index) to join when handed out; a FailedBatch as it is
    event: Any
    host: HostBatch | None  # whose slot to release once the copy is done (None: staged, released already)
    staging: np.ndarray | None


class DevicePrefetcher:
    """Owns the side stream, the ring's registration and the staging buffers of one loader."""

    def __init__(self, pin_memory: bool | str, ops: PrefetchOps | None = None, events: Listener | None = None,
                 clock: Callable[[], float] = time.perf_counter, output: str = "auto") -> None:
        self.ops: PrefetchOps = ops if ops is not None else CudaOps()
        self.as_output = OutputTree(output)  # the framework batches are handed out in (``ring.frameworks``)
        self.pin_memory = pin_memory
        self.pin_path = planned_pin_path(pin_memory)
        self.pin_error: str | None = None
        self._registration: Registration | None = None
        self._side: Any = None
        self._staging_free: list[np.ndarray] = []
        self._staging_count = 0
        self._layout: SlotLayout | None = None
        self._ring: Ring | None = None
        self._frameworks: tuple[Any, tuple[str, ...]] = (None, ())  # the last batch structure's, and its frameworks
        self.events, self.clock = events, clock  # each batch's host seconds issuing copies (staging memcpy included)

    def attach(self, ring: Ring) -> str:
        """Page-lock ``ring`` (once per ring) when pinning; fall back to staging if CUDA refuses."""
        self.detach()
        self._ring, self._layout = ring, ring.layout
        if self.pin_memory is True:
            try:
                self._registration = self.ops.register(ring.buffer)
                self.pin_path = "registered"
            except Exception as exc:  # noqa: BLE001 - any refusal means: use the staging path
                self.pin_error = f"{type(exc).__name__}: {exc}"
                self.pin_path = "staging"
        return self.pin_path

    def detach(self) -> None:
        """Undo the registration (before the ring is unmapped). Idempotent."""
        reg, self._registration, self._ring = self._registration, None, None
        if reg is not None:
            reg.close()

    def close(self) -> None:
        self.detach()
        self._staging_free = []
        self._staging_count = 0
        self._side = None

    # -- the pipeline

    def batches(self, source: BatchSource, layout: SlotLayout | None = None) -> Generator[Any, None, None]:
        """Device batches from ``source`` (a host-batch source), one copy ahead of the consumer.

        ``layout`` is the ring's (the staging buffers are cut by it); by default, the attached ring's.
        A batch the source could not make is yielded in its turn as the ``FailedBatch`` it raised.
        Each epoch's side stream is made with the loader's device current (it runs each step there): an event
        is recorded only on a stream of the current device, and ``device_id`` may be set between epochs.
        """
        self._side = self.ops.new_stream()
        inflight: deque[_Copy] = deque()
        pending: deque[_Copy] = deque()
        try:
            while True:
                self._reclaim(source, pending, block=False)
                if not inflight:
                    self._reclaim(source, pending, block=True)  # give the source every slot before waiting on it
                    if not self._issue(source, layout, inflight, pending, block=True):
                        return
                cur = inflight[0]  # stays in inflight (released in the finally) if the next issue raises
                self._issue(source, layout, inflight, pending, block=False)  # keep batch n+1 in flight
                pending.append(inflight.popleft())
                if cur.event is None:  # a failed batch, handed out in its turn
                    yield cur.batch
                    continue
                self.ops.wait(self.ops.current_stream(), cur.event)
                treedef, dev, objects, index = cur.batch
                try:
                    batch = join(self.as_output(treedef), dev, objects)
                except Exception as exc:  # noqa: BLE001 - this batch's failure, raised in its turn
                    batch = unjoinable(exc, index, source.number(index))  # yielded out of the handler: Python 3.10 keeps a suspended one's traceback
                yield batch
        finally:
            for c in list(inflight) + list(pending):
                if c.event is None or self._settled(c.event):
                    self._release(source, c)

    def _issue(self, source: BatchSource, layout: SlotLayout | None, inflight: deque, pending: deque, block: bool) -> bool:
        try:
            hb = source.next(block)
        except FailedBatch as failed:
            inflight.append(_Copy(failed.with_traceback(None), None, None, None))  # its frames hold the source
            return True
        if hb is None:
            return False
        ring = source.ring() if hb.slot is not None else None
        if ring is not None and ring is not self._ring:
            self.attach(ring)  # the first batch in a new ring: page-lock it before copying from it
        c = _Copy(None, None, hb, None)
        t0 = self.clock()
        try:
            layout = layout if layout is not None else self._layout
            treedef = hb.treedef if hb.treedef is not None else _treedef(layout)
            consumer = self.ops.current_stream()
            dev = [self.ops.empty(a.shape, a.dtype, consumer) for a in hb.leaves]
            for stream in (consumer, *self._framework_streams(treedef)):
                self.ops.wait(self._side, self.ops.record(stream))
            src = hb.leaves if hb.slot is not None else [np.ascontiguousarray(a) for a in hb.leaves]
            if self.pin_path == "staging" and hb.slot is not None and layout is not None:
                c.staging = self._staging_buffer(source, layout, pending)
                src = layout.views(c.staging, 0, hb.rows)
                for d, s in zip(src, hb.leaves):
                    np.copyto(d, s)
                source.release(hb)
                c.host = None
            for d, s in zip(dev, src):
                self.ops.h2d(d, s, self._side)
            c.batch = (treedef, dev, hb.objects, hb.index)
            c.event = self.ops.record(self._side)
        except Exception as exc:  # noqa: BLE001 - a CUDA error or out of memory: this batch's failure
            if not self._abandon(source, c):
                raise copy_failed(exc, source.number(hb.index)) from None  # the device cannot go on: the epoch ends here
            inflight.append(_Copy(FailedBatch(copy_failed(exc, source.number(hb.index)), hb.index), None, None, None))
            return True
        except BaseException:
            self._abandon(source, c)
            raise
        finally:
            if self.events is not None:
                self.events.copied(self.clock() - t0)
        inflight.append(c)
        return True

    def _framework_streams(self, treedef: Any) -> list[Any]:
        """The current streams of the frameworks ``treedef``'s leaves are handed to, where not the consumer's."""
        if self._frameworks[0] is not treedef:
            named = {fw for fw in leaf_frameworks(self.as_output(treedef)) if fw is not None}
            self._frameworks = (treedef, tuple(sorted(named)))
        streams = (self.ops.framework_stream(fw) for fw in self._frameworks[1])
        return [s for s in streams if s is not None]

    def _settled(self, event: Any) -> bool:
        """Wait for ``event``; False when the device cannot be waited for (its error is the caller's to see from
        its own next CUDA call, never in place of the error that ended the epoch): the memory is then kept."""
        try:
            self.ops.sync(event)
        except Exception:  # noqa: BLE001 - see above
            return False
        return True

    def _abandon(self, source: BatchSource, c: _Copy) -> bool:
        """A copy that failed half-way: give its slot and staging buffer back once no queued copy reads them.
        False when the side stream cannot be waited for: the memory is kept (safe), and the device is unusable."""
        try:
            event = self.ops.record(self._side)
        except Exception:  # noqa: BLE001 - the first error is the one to report; keeping the memory is safe
            return False
        if not self._settled(event):
            return False
        self._release(source, c)
        return True

    def _staging_buffer(self, source: BatchSource, layout: SlotLayout, pending: deque) -> np.ndarray:
        if not self._staging_free and self._staging_count >= STAGING_BUFFERS and pending:
            if pending[0].event is not None:
                self.ops.sync(pending[0].event)
            self._release(source, pending.popleft())
        if self._staging_free:
            return self._staging_free.pop()
        self._staging_count += 1
        return self.ops.pinned(layout.slot_bytes)

    def _reclaim(self, source: BatchSource, pending: deque, block: bool) -> None:
        # Copies on one stream complete in order: the head is always the oldest.
        while pending and (block or pending[0].event is None or self.ops.done(pending[0].event)):
            if block and pending[0].event is not None:
                self.ops.sync(pending[0].event)
            self._release(source, pending.popleft())

    def _release(self, source: BatchSource, c: _Copy) -> None:
        if c.host is not None:
            source.release(c.host)
            c.host = None
        if c.staging is not None:
            self._staging_free.append(c.staging)
            c.staging = None


def planned_pin_path(pin_memory: bool | str) -> str:
    """The path ``pin_memory`` asks for, before a refused registration turns "registered" into "staging"."""
    return "none" if not pin_memory else ("staging" if pin_memory == "staging" else "registered")


def copy_failed(exc: Exception, batch_index: int) -> WorkerError:
    """A batch whose copy to the GPU could not be issued (out of memory, a CUDA error), in one line; an instance
    of the original type too where it can be (``except MemoryError`` still catches an out-of-memory)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    err = as_worker_error(type(exc), f"the main process (pid {os.getpid()}) failed on batch {batch_index}: "
                          f"its copy to the GPU could not be issued: {text}",
                          pid=os.getpid(), batch_index=batch_index, exc_type=type(exc).__name__)
    err.__cause__ = exc.with_traceback(None)  # its frames hold the source, and so the ring, past close()
    return err


def _treedef(layout: SlotLayout | None) -> Any:
    if layout is None:
        raise RunError("internal error: a ring batch without a ring layout")
    return layout.treedef
