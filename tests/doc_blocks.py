"""The docs' code blocks, for the tests that run or read them (the integration guides)."""

from __future__ import annotations

import re

from conftest import REPO


def fenced_blocks(doc: str, lang: str) -> list[str]:
    """The ```lang blocks of a docs page (a path from the repository root), in order."""
    return re.findall(rf"```{lang}\n(.*?)```", (REPO / doc).read_text(encoding="utf-8"), re.DOTALL)


def python_blocks(doc: str) -> list[str]:
    """The ```python blocks of a docs page, in order."""
    return fenced_blocks(doc, "python")


def run_doc_block(code: str, name: str, monkeypatch, env: dict[str, str]) -> dict:
    """Execute a docs block as a script with ``env`` set; return its globals."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    namespace = {"__name__": "__main__"}
    exec(compile(code, name, "exec"), namespace)  # noqa: S102 - the docs' own example
    return namespace
