"""Kernels people write (tests/corpus/index.json says what each provides)."""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def entries() -> list[dict]:
    return json.loads((HERE / "index.json").read_text())["kernels"]


def source(entry: dict) -> str:
    return (HERE / entry["file"]).read_text()
