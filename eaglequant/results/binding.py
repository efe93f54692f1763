"""Which bytes a result is about: the sha256 of every file of a model folder, checked.

A validation report, the model card and ``eaglequant publish`` each name the exact
files they speak for. For an exported folder those are the files its manifest
lists, and every listed digest is verified against the bytes on disk (a changed
byte is bad input naming the file); for any other folder (a BF16 source draft),
every file in it. Paths are relative to the folder, never the machine's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from eaglequant.errors import InputError
from eaglequant.io.readback import sha256_file
from eaglequant.results.manifest import MANIFEST_FILE, read_manifest


def manifest_files(folder: Path) -> dict[str, str] | None:
    """The manifest's ``files`` (relative path -> sha256), or None without a manifest."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    files = read_manifest(folder).get("files")
    if not isinstance(files, dict) or not files:
        raise InputError(f"{path}: has no 'files' block; re-export the draft")
    return {str(name): str(digest) for name, digest in files.items()}


def verify_files(folder: Path, expected: dict[str, str], source: str) -> None:
    """Every file of ``expected`` exists and hashes as recorded; InputError naming the first
    that does not (``source`` says where the digests came from)."""
    for name in sorted(expected):
        path = folder / name
        if not path.is_file():
            raise InputError(f"{path}: missing, but {source} lists it; re-export the draft")
        if sha256_file(path) != expected[name]:
            raise InputError(
                f"{path}: sha256 differs from {source}: the file changed after it was "
                "recorded; re-export the draft (or restore the file)"
            )


def folder_files(folder: Path) -> dict[str, str]:
    """sha256 of every non-hidden file below ``folder``, by relative POSIX path."""
    return {
        path.relative_to(folder).as_posix(): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not any(p.startswith(".") for p in path.relative_to(folder).parts)
    }


def bound_files(folder: Path) -> dict[str, str]:
    """The files a result about ``folder`` is bound to: the manifest's (verified), else all."""
    listed = manifest_files(folder)
    if listed is None:
        return folder_files(folder)
    verify_files(folder, listed, f"the manifest {MANIFEST_FILE}")
    return listed


class BindingJson(TypedDict):
    """:class:`Binding` as a report writes it."""

    name: str
    files: dict[str, str]


@dataclass(frozen=True)
class Binding:
    """A report's record of one folder: its name and its bound files (relative path ->
    sha256)."""

    name: str
    files: dict[str, str]

    def to_json(self) -> BindingJson:
        return {"name": self.name, "files": dict(self.files)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Binding:
        return cls(name=str(data["name"]), files=dict(data["files"]))


def binding(folder: Path) -> Binding:
    """The report's record of one folder: its name and its bound files."""
    return Binding(name=folder.name, files=bound_files(folder))


def files_digest(files: dict[str, str]) -> str:
    """One sha256 over a relative path -> sha256 map (order-independent)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def first_difference(recorded: dict[str, str], actual: dict[str, str]) -> str | None:
    """The first file whose digest differs between two maps, or that only one lists."""
    for name in sorted(set(recorded) | set(actual)):
        if recorded.get(name) != actual.get(name):
            return name
    return None
