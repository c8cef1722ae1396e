"""A bad command line is one line on stderr and exit 2, as every other error; a bare ``cupy-nwt`` shows its short
help; and whatever a command ends with, its message is one line, with exit 2 only for our own verdicts on input."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from cupy_nwt import ArgumentError, cli
from cupy_nwt.cli.exits import failure
from cupy_nwt.nwt.fast import MIN_FAST_ITERATIONS, OPEN_CAP_MAX, open_cap


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err


@pytest.mark.parametrize(("argv", "line"), [
    (["tune", "--strategy", "slow"],
     "cupy-nwt tune: --strategy: invalid choice 'slow' (choose from fast, paper); see cupy-nwt tune --help"),
    (["stats", "--device", "gpu"],
     "cupy-nwt stats: --device: invalid choice 'gpu' (choose from auto, cuda, cpu); see cupy-nwt stats --help"),
    (["bandwidth", "--foo"], "cupy-nwt bandwidth: unrecognized arguments: --foo; see cupy-nwt bandwidth --help"),
    (["info", "extra"], "cupy-nwt info: unrecognized arguments: extra; see cupy-nwt info --help"),
    (["tun"], "cupy-nwt: COMMAND: invalid choice 'tun' (choose from info, bandwidth, overlap, tune, stats, "
              "reproduce); see cupy-nwt --help"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, line, capsys):
    assert _parse_error(argv, capsys) == line + "\n"


def test_a_value_that_looks_like_an_option_says_how_to_give_it(capsys):
    err = _parse_error(["bandwidth", "--min", "-4KiB"], capsys)
    assert "--min: needs a value" in err and "--min=VALUE" in err and "expected one argument" not in err


def test_a_bare_command_prints_the_short_help_and_exits_2(capsys):
    assert cli.main([]) == cli.EXIT_USAGE
    out = capsys.readouterr()
    assert out.err == "" and out.out.startswith("usage: cupy-nwt")
    assert all(f"  {name}" in out.out for name in ("info", "bandwidth", "overlap", "tune", "stats", "reproduce"))
    assert len(out.out.splitlines()) < 15


def test_a_users_multi_line_error_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "twolines.py").write_text("raise ValueError('first\\nsecond')\n")
    np.savez(tmp_path / "d.npz", images=np.zeros((8, 4, 4, 3), np.uint8), labels=np.arange(8) % 2)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tune", "--dataset", "d.npz", "--transform", "twolines:x", "--no-progress",
                     "--no-save"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "first second" in err, err


def test_only_our_own_value_errors_are_bad_input():
    args = argparse.Namespace()
    assert failure(ArgumentError("a\nb"), args) == (cli.EXIT_USAGE, "a b")
    code, line = failure(ValueError("Maximum allowed size exceeded"), args)
    assert code == cli.EXIT_FAILED and line.startswith("unexpected error: ValueError: Maximum allowed")


def test_tune_help_says_how_far_each_search_goes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: usable CPUs)" not in text
    assert f"up to 4 workers per usable CPU, at least {open_cap(1)}, at most {OPEN_CAP_MAX}" in text
    assert "the fast search times a fifth to a tenth of them" in text
    assert f"the fast search needs >= {MIN_FAST_ITERATIONS}" in text
