"""Every error cupy_nwt raises can be built from a message and survives pickling: type, message, fields.

A loader run inside a ``multiprocessing.Pool`` task, a Ray task or any harness that forwards
exceptions pickles the error; one that cannot be rebuilt turns into a ``TypeError`` there. The
first test walks every class the errors module defines, so a class added later is covered too.
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import cupy_nwt
from cupy_nwt import errors
from cupy_nwt.errors import DamagedArchiveError, DataFileError, StateError, WorkerDiedError, WorkerError

ERROR_CLASSES = sorted((cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                        if issubclass(cls, BaseException) and cls.__module__ == errors.__name__),
                       key=lambda cls: cls.__name__)


def round_trip(exc: BaseException) -> BaseException:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)
    return back


def test_the_walk_finds_the_errors():
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"CupyNwtError", "WorkerError", "WorkerDiedError", "DataFileError", "DamagedArchiveError"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_builds_from_a_message_and_pickles(cls):
    exc = cls("message")
    assert str(exc) == "message" and isinstance(exc, errors.CupyNwtError)
    round_trip(exc)


@pytest.mark.parametrize("exc", [
    WorkerError("w", worker_id=1, pid=42, batch_index=3, sample_index="key", exc_type="KeyError", traceback_text="tb"),
    WorkerDiedError("d", worker_id=0, pid=7, exitcode=-9),
    DataFileError("a.npy", "is empty (0 bytes), not a .npy array"),
    DamagedArchiveError("a.tar", 512, "cut short"),
    StateError("bad", "delivered", -3),
], ids=lambda e: type(e).__name__)
def test_errors_with_fields_keep_them_through_pickling(exc):
    back = round_trip(exc)
    assert vars(back) and all(getattr(back, k) == v for k, v in vars(exc).items())


class Lost:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            raise KeyError(f"sample {i} is lost")
        return i


def load_all() -> list:
    return [b.tolist() for b in cupy_nwt.DataLoader(Lost(), batch_size=2, device="cpu")]


def test_a_loader_s_error_as_the_dataset_s_type_pickles():
    with pytest.raises(KeyError) as ei:
        load_all()
    back = round_trip(ei.value)
    assert isinstance(back, KeyError) and isinstance(back, WorkerError) and back.sample_index == 2


def test_a_dual_error_of_a_local_class_pickles_as_a_worker_error():
    class Local(Exception):
        pass

    err = errors.as_worker_error(Local, "text", worker_id=0, pid=1)
    assert isinstance(err, Local)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is WorkerError and str(back) == "text" and back.worker_id == 0


def dies() -> None:
    raise WorkerDiedError("loader worker 1 (pid 4242) died", worker_id=1, pid=4242, exitcode=-9)


@pytest.mark.parametrize("task", [load_all, dies], ids=["loader-failure", "worker-died"])
def test_a_pool_task_s_loader_error_reaches_the_caller_as_itself(task):
    with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as pool:
        with pytest.raises(errors.LoaderError) as ei:
            pool.submit(task).result()
    if task is load_all:
        assert isinstance(ei.value, KeyError) and ei.value.batch_index == 1 and "sample 2 is lost" in str(ei.value)
    else:
        assert type(ei.value) is WorkerDiedError and ei.value.exitcode == -9 and ei.value.signal_name == "SIGKILL"
