"""Every package the project asks for, core or extra, is named in the README's table of why it is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def requirement_names() -> set[str]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in wanted}  # type: ignore[union-attr]


def table_names() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head = text.index("| package | why |")
    rows = text[head:].split("\n\n", 1)[0].splitlines()[2:]
    return " ".join(row.split("|")[1] for row in rows).lower()


def test_every_requirement_says_why_in_the_readme():
    named = table_names()
    missing = [name for name in sorted(requirement_names())
               if not re.search(rf"(?<![\w-]){re.escape(re.sub(r'-cu1[23]$', '', name))}(?![\w])", named)]
    assert not missing, f"the README's dependency table does not say why these are needed: {missing}"
