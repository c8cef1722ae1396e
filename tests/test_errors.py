"""The error hierarchy (one base, the builtin bases kept, one exit code each) and the argument checks."""

from __future__ import annotations

import ast
import builtins
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from toy_data import Squares

import cupy_nwt
import cupy_nwt.loader.ring.ring as shm
from cupy_nwt import cli, errors
from cupy_nwt._checks import check_int, check_number
from cupy_nwt.errors import (
    AgainstError,
    ArgumentError,
    ArgumentTypeError,
    BaselineError,
    BatchLayoutError,
    BatchStructureError,
    BatchTypeError,
    CallgrindError,
    CorruptImageError,
    CupyNwtError,
    DamagedArchiveError,
    DataError,
    DataFileError,
    LayoutError,
    LoaderClosedError,
    LoaderError,
    LoaderTimeoutError,
    MissingExtraError,
    MissingPathError,
    MisuseError,
    NoGPUError,
    OutOfRangeError,
    RingMemoryError,
    RunError,
    SavedPickError,
    ShmSpaceError,
    StateError,
    TooManyBadSamplesError,
    UnknownKeyError,
    WorkerDiedError,
    WorkerError,
)

# Each error, one instance of it, the builtin bases callers catch it by, and the cupy-nwt exit code.
CASES = {
    CupyNwtError: (CupyNwtError("x"), (Exception,), 1),
    ArgumentError: (ArgumentError("x"), (ValueError,), 2),
    NoGPUError: (NoGPUError("x"), (RuntimeError,), 3),
    LayoutError: (LayoutError("x"), (ValueError,), 2),
    BatchLayoutError: (BatchLayoutError("x", 3), (ValueError,), 2),
    BatchTypeError: (BatchTypeError("x", 3), (ValueError, TypeError), 2),
    BatchStructureError: (BatchStructureError("x", 3), (ValueError, RuntimeError), 2),
    DataError: (DataError("x"), (ValueError,), 4),
    CorruptImageError: (CorruptImageError("x", 3), (ValueError, DataError), 4),
    DamagedArchiveError: (DamagedArchiveError("a.tar", 512, "cut"), (ValueError, DataError), 4),
    DataFileError: (DataFileError("a.npy", "is empty (0 bytes)"), (ValueError, DataError), 4),
    StateError: (StateError("x", "delivered", -3), (ValueError,), 2),
    LoaderError: (LoaderError("x"), (RuntimeError,), 5),
    ShmSpaceError: (ShmSpaceError("x"), (RuntimeError, MemoryError, LoaderError), 5),
    RingMemoryError: (RingMemoryError("x"), (RuntimeError, MemoryError, LoaderError, ShmSpaceError), 5),
    WorkerError: (WorkerError("x", worker_id=0, pid=1, batch_index=2, sample_index=3, exc_type="KeyError",
                              traceback_text=""), (RuntimeError, LoaderError), 4),
    WorkerDiedError: (WorkerDiedError("x", worker_id=0, pid=1, exitcode=-9), (RuntimeError, LoaderError), 5),
    LoaderTimeoutError: (LoaderTimeoutError("x"), (RuntimeError, TimeoutError, LoaderError), 5),
    LoaderClosedError: (LoaderClosedError("x"), (RuntimeError, LoaderError), 5),
    ArgumentTypeError: (ArgumentTypeError("x"), (TypeError, ArgumentError), 2),
    OutOfRangeError: (OutOfRangeError("x"), (IndexError,), 1),
    UnknownKeyError: (UnknownKeyError("x"), (KeyError,), 1),
    MissingPathError: (MissingPathError("x"), (FileNotFoundError, OSError), 2),
    MissingExtraError: (MissingExtraError("x"), (ImportError,), 2),
    MisuseError: (MisuseError("x"), (RuntimeError,), 1),
    RunError: (RunError("x"), (RuntimeError,), 1),
    SavedPickError: (SavedPickError("x"), (ValueError,), 2),
    TooManyBadSamplesError: (TooManyBadSamplesError("x"), (ValueError, DataError), 4),
    AgainstError: (AgainstError("x"), (RuntimeError,), 1),
    CallgrindError: (CallgrindError("x"), (RuntimeError,), 1),
    BaselineError: (BaselineError("x"), (ValueError,), 2),
}


def test_the_table_covers_every_error():
    assert {getattr(errors, name) for name in errors.__all__} == set(CASES)


@pytest.mark.parametrize("cls", CASES, ids=lambda c: c.__name__)
def test_every_error_is_a_cupy_nwt_error_and_keeps_its_builtin_bases(cls):
    exc, bases, _ = CASES[cls]
    assert type(exc) is cls
    assert isinstance(exc, CupyNwtError)
    for base in bases:
        assert isinstance(exc, base), f"{cls.__name__} is no longer a {base.__name__}"
    assert cls.__doc__ and cls.__doc__.strip()


def test_a_loader_error_handler_catches_a_full_dev_shm(monkeypatch, tmp_path):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "no-shm-mount"))
    layout = shm.SlotLayout.for_batch((Squares(4)[0][0][None],), 8)
    with pytest.raises(LoaderError) as info:
        shm.Ring(layout, 2)
    assert type(info.value) is ShmSpaceError


def test_every_error_is_exported_from_the_package():
    for name in errors.__all__:
        assert name in cupy_nwt.__all__
        assert getattr(cupy_nwt, name) is getattr(errors, name)


def _package_sources():
    root = Path(cupy_nwt.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root.parent), ast.parse(path.read_text(encoding="utf-8"))


def test_errors_are_imported_only_from_the_errors_module():
    """One home per error: a module that needs ``DataError`` (say) imports it from ``cupy_nwt.errors``."""
    wrong = []
    for path, tree in _package_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "errors" and not (node.module or "").endswith(".errors"):
                if node.module == "cupy_nwt" or (node.level == 1 and node.module is None and path.name == "__init__.py"):
                    continue
                wrong += [f"{path}:{node.lineno} {a.name}" for a in node.names if a.name in errors.__all__]
    assert wrong == []


# exceptions a raise may name that are not "our" errors: Python's protocols (iteration, attribute lookup,
# abstract methods, a KeyboardInterrupt passed on, a path hook declining a folder) and the warnings machinery
PROTOCOL = {"StopIteration", "AttributeError", "NotImplementedError", "KeyboardInterrupt", "SystemExit",
            "GeneratorExit", "AssertionError", "ImportError"}


def test_every_deliberate_raise_derives_from_cupy_nwt_error():
    """``raise ValueError(...)`` (or any builtin but Python's protocol ones) is a bare error: use a class of
    ``cupy_nwt.errors`` (``ArgumentError`` is a ValueError, ``ArgumentTypeError`` a TypeError)."""
    builtin = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
               and issubclass(getattr(builtins, n), BaseException)} - PROTOCOL
    bare = []
    for path, tree in _package_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in builtin:
                    bare.append(f"{path}:{node.lineno} {target.id}")
    assert bare == []


@pytest.mark.parametrize("exc", [BatchLayoutError("bad field", 7), CorruptImageError("a.png: not an image", 7),
                                 DamagedArchiveError("a.tar", 1024, "cut short")], ids=lambda e: type(e).__name__)
def test_errors_a_worker_sends_back_survive_pickling(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)


def test_the_errors_module_and_cuda_import_nothing_heavy():
    code = "import sys, cupy_nwt.errors, cupy_nwt.cuda; print(sorted({'cupy', 'torch', 'numba'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("cls", CASES, ids=lambda c: c.__name__)
def test_the_cli_gives_each_error_its_exit_code_and_one_line(cls, monkeypatch, capsys):
    exc, _, code = CASES[cls]

    def fails(args):
        raise exc

    monkeypatch.setattr("cupy_nwt.cli.commands.cmd_info", fails)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["info"]) == code
    err = capsys.readouterr().err
    assert err.startswith("cupy-nwt info: ") and err.count("\n") == 1


# -- the argument checks

@pytest.mark.parametrize(("value", "want"), [(0, 0), (5, 5), (np.int64(5), 5), (np.uint8(3), 3), (2**70, 2**70)])
def test_check_int_accepts_integers_and_returns_a_python_int(value, want):
    got = check_int("n", value, ge=0)
    assert got == want and type(got) is int


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({}, True, "n must be an integer, got True"),
    ({}, np.bool_(True), f"n must be an integer, got {np.bool_(True)!r}"),
    ({}, 2.0, "n must be an integer, got 2.0"),
    ({}, "3", "n must be an integer, got '3'"),
    ({}, None, "n must be an integer, got None"),
    ({"ge": 0}, -1, "n must be a non-negative integer, got -1"),
    ({"ge": 1}, 0, "n must be a positive integer, got 0"),
    ({"ge": 2}, np.int32(1), f"n must be an integer >= 2, got {np.int32(1)!r}"),
    ({"le": 4}, 5, "n must be an integer <= 4, got 5"),
    ({"ge": 0, "le": 2}, 3, "n must be an integer from 0 to 2, got 3"),
    ({"ge": 0, "optional": True}, -1, "n must be a non-negative integer or None, got -1"),
    ({"ge": 0, "also": "'auto'"}, "many", "n must be a non-negative integer or 'auto', got 'many'"),
    ({"ge": 0, "also": "'auto'", "optional": True}, False,
     "n must be a non-negative integer or 'auto' or None, got False"),
])
def test_check_int_refuses_with_one_exact_line(kwargs, value, message):
    with pytest.raises(ArgumentError) as info:
        check_int("n", value, **kwargs)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [1.0, "3", True, None, [1]])
def test_a_value_of_the_wrong_type_is_a_type_error_too(value):
    """torch raises ``TypeError`` for ``num_workers=1.0``; a caller catching ``ValueError`` still catches it."""
    checks = [lambda: check_int("n", value, ge=0)]
    if not isinstance(value, float):
        checks.append(lambda: check_number("t", value, ge=0))
    for check in checks:
        with pytest.raises(ArgumentTypeError) as info:
            check()
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(ArgumentError) as info:
        check_int("n", -1, ge=0)
    assert not isinstance(info.value, TypeError)  # a value of the right type, out of range


def test_check_int_lets_none_through_only_when_optional():
    assert check_int("seed", None, ge=0, optional=True) is None
    assert check_int("seed", 0, ge=0, optional=True) == 0
    with pytest.raises(ArgumentError, match="seed must be a non-negative integer, got None"):
        check_int("seed", None, ge=0)


@pytest.mark.parametrize(("kwargs", "value", "want"), [
    ({"gt": 0}, 0.5, 0.5), ({"gt": 0}, 3, 3.0), ({"gt": 0}, np.float32(0.25), 0.25), ({"ge": 0}, 0, 0.0),
    ({"ge": 0, "lt": 0.5}, np.int64(0), 0.0), ({"le": 1}, 1, 1.0), ({}, -7.5, -7.5),
])
def test_check_number_accepts_finite_reals_and_returns_a_python_float(kwargs, value, want):
    got = check_number("x", value, **kwargs)
    assert got == want and type(got) is float


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({"gt": 0, "unit": "seconds", "optional": True}, 0, "timeout must be a positive number of seconds or None, got 0"),
    ({"gt": 0, "unit": "seconds"}, True, "timeout must be a positive number of seconds, got True"),
    ({"gt": 0}, "1", "timeout must be a positive number, got '1'"),
    ({"gt": 0}, float("nan"), "timeout must be a positive number, got nan"),
    ({"gt": 0}, float("inf"), "timeout must be a positive number, got inf"),
    ({"gt": 0}, 10**400, "timeout must be a positive number, got " + repr(10**400)),
    ({"ge": 0}, -0.1, "timeout must be a non-negative number, got -0.1"),
    ({"ge": 0, "lt": 0.5}, 0.5, "timeout must be a number in [0, 0.5), got 0.5"),
    ({"gt": 0, "le": 2}, 0, "timeout must be a number in (0, 2], got 0"),
    ({"gt": 1}, 1, "timeout must be a number > 1, got 1"),
    ({"ge": 1.5}, 1, "timeout must be a number >= 1.5, got 1"),
    ({"lt": 0}, 0, "timeout must be a number < 0, got 0"),
    ({}, None, "timeout must be a finite number, got None"),
])
def test_check_number_refuses_with_one_exact_line(kwargs, value, message):
    with pytest.raises(ArgumentError) as info:
        check_number("timeout", value, **kwargs)
    assert str(info.value) == message


def test_check_number_lets_none_through_only_when_optional():
    assert check_number("timeout", None, gt=0, optional=True) is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": -1}, "the dataset length must be a non-negative integer, got -1"),
    ({"batch_size": True}, "batch_size must be a positive integer, got True"),
    ({"seed": -3}, "seed must be a non-negative integer, got -3"),
    ({"world_size": 0}, "world_size must be a positive integer, got 0"),
    ({"rank": 3, "world_size": 3}, "rank (of world_size 3) must be an integer from 0 to 2, got 3"),
])
def test_the_sampler_refuses_through_the_checks(kwargs, message):
    from cupy_nwt.loader.plan.order import BatchSampler

    with pytest.raises(ArgumentError) as info:
        BatchSampler(**{"n": 10, "batch_size": 2, **kwargs})
    assert str(info.value) == message
