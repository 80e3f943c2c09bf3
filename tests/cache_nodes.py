"""Cluster nodes in one test process, for the shared tier's tests: each node its own cache
directory (and memory layer), all of them sharing the tier the test configures."""
from __future__ import annotations

from pathlib import Path

import kjit.cache
from kjit.objectcode import ObjectCode


def ptx(tag: str) -> ObjectCode:
    """A tiny PTX entry named `tag`: a value to store without compiling anything."""
    text = f".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry {tag}()\n{{\nret;\n}}\n"
    return ObjectCode(text.encode(), kind="ptx", name=tag)


def node(monkeypatch, tmp_path: Path, name: str) -> None:
    """Switch this process to another node's cache directory (its own memory layer too)."""
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / name))


def lookup_in(namespace: str, tag: str, created: list | None = None) -> ObjectCode:
    """`tag`'s value through every layer; `created` collects the tags made here."""
    def create():
        if created is not None:
            created.append(tag)
        return ptx(tag)
    return kjit.cache.get_or_create(namespace, {"tag": tag}, create)
