"""``eaglequant publish``: upload an exported, validated, carded folder to the Hugging Face Hub.

Before anything is sent, the folder must be what was proved: every file's sha256
equals the export manifest, the validation report passed on exactly these files,
and the card (``README.md``) was rendered from these files, that report and this
repository id. Uploaded are the exported files, the card and its plots, and the
manifest with the paths it records as placeholders; the validation report stays
local (it names this machine's paths; its results are in the card). The upload
is one commit through ``huggingface_hub`` (the repository is created when
missing; the token comes from ``HF_TOKEN`` or ``hf auth login``); files whose
remote sha256 (LFS) or git blob id already equals the local bytes are not sent,
and when none differs no commit is made.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglequant import __version__
from eaglequant.errors import InputError, PublishFailed
from eaglequant.hub.card import (
    CARD_FILE,
    calibration_source,
    card_record,
    check_report_binding,
)
from eaglequant.hub.public import local_paths, replace_strings
from eaglequant.io.readback import CHUNK, sha256_file
from eaglequant.render.reports import PLOTS
from eaglequant.results.binding import files_digest, manifest_files, verify_files
from eaglequant.results.manifest import MANIFEST_FILE, read_manifest
from eaglequant.results.provenance import ABSOLUTE_PATH
from eaglequant.results.validation_report import PASS, ValidationReport, read_report

if TYPE_CHECKING:
    from huggingface_hub import RepoFile

VALIDATION_FILE = "validation.json"
# Written beside the export by ``validate --json/--markdown`` when asked; read, never uploaded.
LOCAL_REPORTS = frozenset({VALIDATION_FILE, "validation.md"})
COMPANIONS = frozenset({MANIFEST_FILE, CARD_FILE, *PLOTS})


@dataclass(frozen=True, kw_only=True)
class PublishRequest:
    folder: Path
    repo_id: str
    validation: Path | None = None  # default: FOLDER/validation.json
    revision: str | None = None
    create_pr: bool = False
    private: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class Upload:
    path: str  # relative to the folder, POSIX
    size: int
    sha256: str
    data: bytes | None = None  # uploaded instead of the file (the path-free manifest)


@dataclass
class PublishResult:
    repo_id: str
    revision: str
    files: list[Upload]
    verdict: str
    dry_run: bool
    created: bool = False
    changed: list[str] = field(default_factory=list)
    commit_url: str | None = None
    commit_oid: str | None = None
    pr_url: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def publish(request: PublishRequest) -> PublishResult:
    """Check the folder, then (unless a dry run) upload what differs in one commit."""
    uploads, verdict = check_folder(request)
    result = PublishResult(
        repo_id=request.repo_id,
        revision=request.revision or "main",
        files=uploads,
        verdict=verdict,
        dry_run=request.dry_run,
    )
    if request.dry_run:
        return result
    # lazy: torch-free core
    from huggingface_hub import get_token

    if get_token() is None:
        raise InputError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login` (dry run: --dry-run)"
        )
    try:
        _upload(request, result)
    except _upload_errors() as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PublishFailed(f"{request.repo_id}: the upload failed: {message}") from exc
    return result


def _upload_errors() -> tuple[type[BaseException], ...]:
    """What a failed upload raises: the Hub's errors and its HTTP client's (httpx2 for
    huggingface_hub 2, httpx for 1; requests' errors are OSErrors)."""
    # lazy: torch-free core
    from huggingface_hub.errors import HfHubHTTPError

    errors: list[type[BaseException]] = [HfHubHTTPError, OSError, ValueError]
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(module).HTTPError)
    return tuple(errors)


def check_folder(request: PublishRequest) -> tuple[list[Upload], str]:
    """The files to upload and the validation verdict; InputError naming the file otherwise."""
    folder = request.folder
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder; pass a folder written by eaglequant export")
    files = manifest_files(folder)
    if files is None:
        raise InputError(
            f"{folder / MANIFEST_FILE}: missing; publish uploads a folder eaglequant export wrote"
        )
    verify_files(folder, files, f"the manifest {MANIFEST_FILE}")
    validation = request.validation or folder / VALIDATION_FILE
    if not validation.is_file():
        raise InputError(
            f"{validation}: no validation report; run eaglequant validate --json {validation} "
            "(or pass --validation PATH)"
        )
    report = read_report(validation)
    check_report_binding(validation, report, files, folder)
    if not report.passed:
        failed = [c.name for c in report.checks if c.counted != PASS]
        raise InputError(
            f"{validation}: the validation did not pass (failed: {', '.join(map(str, failed))}); "
            "only a draft that passed is published"
        )
    _check_card(folder, request.repo_id, files, validation)
    uploads = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or any(p.startswith(".") for p in rel.parts):
            continue
        name = rel.as_posix()
        if name in LOCAL_REPORTS:
            continue
        if name not in files and name not in COMPANIONS:
            raise InputError(
                f"{path}: not listed in the manifest; remove it (publish uploads only the "
                "exported files, the manifest, the card and its plots) or re-export"
            )
        if name == MANIFEST_FILE:
            data = published_manifest(folder)
            uploads.append(Upload(name, len(data), hashlib.sha256(data).hexdigest(), data))
            continue
        digest = files.get(name) or sha256_file(path)
        uploads.append(Upload(name, path.stat().st_size, digest))
    return uploads, verdict_text(report)


def published_manifest(folder: Path) -> bytes:
    """The manifest as uploaded: the paths it records (source draft, calibration inputs) as
    placeholders, so the Hub copy names nothing of this machine."""
    manifest = read_manifest(folder)
    source = str(manifest.get("source") or "")
    replacements = [(source, "<BF16_DRAFT>"), (str(Path(source).resolve()), "<BF16_DRAFT>")]
    replacements = [(p, n) for p, n in replacements if "/" in p]
    replacements += [(p, "<PATH>") for p in local_paths(folder, manifest, None, None)]
    replacements.sort(key=lambda pair: len(pair[0]), reverse=True)
    cleaned = replace_strings(manifest, replacements)
    if source:
        cleaned["source"] = "<BF16_DRAFT>"
    calibration = cleaned.get("calibration") or {}
    if calibration:
        calibration["source"] = calibration_source(manifest["calibration"])
    capture = calibration.get("capture") or {}
    for key, name in (("target", "<TARGET>"), ("data", "<CALIB_DATA>")):
        if capture.get(key):
            capture[key] = name
    return ABSOLUTE_PATH.sub("<PATH>", json.dumps(cleaned, indent=2) + "\n").encode()


def _check_card(folder: Path, repo_id: str, files: dict[str, str], validation: Path) -> None:
    card = folder / CARD_FILE
    rerun = f"rerun eaglequant card {folder} --repo-id {repo_id} --validation {validation}"
    if not card.is_file():
        raise InputError(f"{card}: missing; {rerun}")
    record = card_record(card.read_text(encoding="utf-8", errors="replace"))
    if record is None:
        raise InputError(f"{card}: not written by eaglequant card (no record line); {rerun}")
    if record.get("files_sha256") != files_digest(files):
        raise InputError(f"{card}: rendered from other files than the manifest lists; {rerun}")
    rendered_from = [record.get("validation_sha256"), *record.get("validations_sha256", [])]
    if sha256_file(validation) not in rendered_from:
        raise InputError(
            f"{card}: rendered from another validation report than {validation}; {rerun}"
        )
    if record.get("repo_id") != repo_id:
        raise InputError(f"{card}: names the repository {record.get('repo_id')!r}; {rerun}")


def verdict_text(report: ValidationReport) -> str:
    passed = sum(1 for c in report.checks if c.passed)
    undecided = report.undecided_categories
    note = f"; undecided: {', '.join(undecided)}" if undecided else ""
    return f"validation passed ({passed}/{len(report.checks)} checks{note})"


def commit_message(verdict: str) -> str:
    return f"Upload FP8 EAGLE-3 draft (eaglequant {__version__}, {verdict})"


def git_blob_id(path: Path, data: bytes | None = None) -> str:
    """The git blob id (sha1 of ``blob <size>\\0`` + bytes): a regular file's id on the Hub."""
    if data is not None:
        return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _upload(request: PublishRequest, result: PublishResult) -> None:
    # lazy: torch-free core
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    api = HfApi()
    try:
        api.repo_info(request.repo_id)
    except RepositoryNotFoundError:
        if request.revision not in (None, "main"):
            raise InputError(
                f"{request.repo_id}: not on the Hub yet, so it has no branch "
                f"{request.revision!r}; publish to main first"
            ) from None
        api.create_repo(request.repo_id, private=request.private, exist_ok=True)
        result.created = True
    remote = _remote_files(api, request, [u.path for u in result.files])
    result.changed = [u.path for u in result.files if not _same(request.folder, u, remote)]
    if not result.changed:
        return
    operations = [
        CommitOperationAdd(
            path_in_repo=u.path,
            path_or_fileobj=u.data if u.data is not None else str(request.folder / u.path),
        )
        for u in result.files
        if u.path in result.changed
    ]
    digest = files_digest({u.path: u.sha256 for u in result.files})
    info = api.create_commit(
        request.repo_id,
        operations,
        commit_message=commit_message(result.verdict),
        commit_description=f"sha256 of the file list: {digest}",
        revision=request.revision,
        create_pr=request.create_pr,
    )
    result.commit_url, result.commit_oid, result.pr_url = info.commit_url, info.oid, info.pr_url


def _remote_files(api: Any, request: PublishRequest, paths: list[str]) -> dict[str, RepoFile]:
    """The remote file entries at the revision, by path (none for a new repository)."""
    # lazy: torch-free core
    from huggingface_hub import RepoFile
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        entries = api.get_paths_info(request.repo_id, paths, revision=request.revision)
    except RevisionNotFoundError as exc:
        raise InputError(
            f"{request.repo_id}: no revision {request.revision!r}; create the branch first or "
            "publish to main"
        ) from exc
    return {e.path: e for e in entries if isinstance(e, RepoFile)}


def _same(folder: Path, upload: Upload, remote: dict[str, RepoFile]) -> bool:
    entry = remote.get(upload.path)
    if entry is None or entry.size != upload.size:
        return False
    if entry.lfs is not None:
        return bool(entry.lfs.sha256 == upload.sha256)
    return bool(entry.blob_id == git_blob_id(folder / upload.path, upload.data))
