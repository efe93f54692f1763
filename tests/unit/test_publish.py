"""``eaglequant publish``: its refusals, its dry run, and a real upload to the Hub stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant import __version__
from eaglequant.cli import main
from eaglequant.hub.publish import published_manifest
from tests.conftest import REPO
from tests.exported import LOCAL_NAMES, Exported, flip_byte, make_exported
from tests.hubstandin import HubStandIn, git_blob_id

REPO_ID = "example/toy-eagle3-fp8"
TOKEN = "hf_standin_token"
# The stand-in stores anything of this size or more as LFS (the Hub's rule is 10 MiB).
LFS_THRESHOLD = 20_000


def carded(tmp_path: Path, *, passed: bool = True) -> Exported:
    exported = make_exported(tmp_path, passed=passed)
    args = ["card", str(exported.folder), "--base-model", "toy/target", "--repo-id", REPO_ID]
    args += ["--validation", str(exported.validation)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return exported


def publish(folder: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["publish", str(folder), "--repo-id", REPO_ID, *extra])
    return result.exit_code, result.output


def publish_to(
    hub: HubStandIn, folder: Path, tmp_path: Path, *extra: str, token: str | None = TOKEN
) -> tuple[int, str]:
    """The CLI in a fresh process, pointed at the stand-in as the Hub (HF_ENDPOINT, HF_TOKEN)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf-home"),
        # The stand-in speaks the LFS protocol; with hf_xet installed the client would use Xet.
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1",
    }
    if token is not None:
        env["HF_TOKEN"] = token
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eaglequant.cli",
            "publish",
            str(folder),
            "--repo-id",
            REPO_ID,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_dry_run_lists_the_files_with_sizes(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    code, output = publish(exported.folder, "--dry-run")
    assert code == 0, output
    lines = output.splitlines()
    manifest = json.loads((exported.folder / "eaglequant.json").read_text())
    names = sorted([*manifest["files"], "README.md", "eaglequant.json"])
    sizes = {n: (exported.folder / n).stat().st_size for n in names}
    sizes["eaglequant.json"] = len(published_manifest(exported.folder))
    assert lines[0] == (
        f"would upload {len(names)} files ({sum(sizes.values())} bytes) to {REPO_ID}@main:"
    )
    assert lines[1:-1] == [f"{sizes[n]:>14}  {n}" for n in names]
    assert lines[-1] == "validation passed (6/6 checks); dry run: nothing was sent"
    assert "validation.json" not in output  # the report names local paths; it stays here


def test_a_flipped_byte_in_a_shard_makes_publish_refuse(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    shard = exported.shards()[2]
    flip_byte(exported.folder / shard, 64)
    code, output = publish(exported.folder, "--dry-run")
    assert code == 2
    assert output.splitlines()[-1].startswith(
        f"error: {exported.folder / shard}: sha256 differs from the manifest eaglequant.json"
    )


def test_publish_refuses_a_failed_validation(tmp_path: Path) -> None:
    exported = make_exported(tmp_path, passed=False)
    code, output = publish(exported.folder, "--dry-run")
    assert code == 2
    assert output.splitlines()[-1] == (
        f"error: {exported.validation}: the validation did not pass (failed: 6 scale "
        "plausibility); only a draft that passed is published"
    )


def test_publish_refuses_a_card_out_of_sync(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    card = exported.folder / "README.md"
    rerun = (
        f"rerun eaglequant card {exported.folder} --repo-id {REPO_ID} "
        f"--validation {exported.validation}"
    )
    code, output = publish(exported.folder, "--repo-id", "other/name", "--dry-run")
    assert code == 2
    assert "names the repository 'example/toy-eagle3-fp8'" in output
    report = json.loads(exported.validation.read_text())
    report["k"] = 4  # another report on the same bytes than the one the card shows
    exported.validation.write_text(json.dumps(report))
    code, output = publish(exported.folder, "--dry-run")
    assert code == 2
    assert output.splitlines()[-1] == (
        f"error: {card}: rendered from another validation report than {exported.validation}; "
        f"{rerun}"
    )
    card.unlink()
    code, output = publish(exported.folder, "--dry-run")
    assert code == 2 and output.splitlines()[-1] == f"error: {card}: missing; {rerun}"


def test_publish_refuses_a_file_the_manifest_does_not_list(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    (exported.folder / "notes.txt").write_text("local notes\n")
    code, output = publish(exported.folder, "--dry-run")
    assert code == 2
    assert output.splitlines()[-1].startswith(
        f"error: {exported.folder / 'notes.txt'}: not listed in the manifest"
    )


def test_publish_uploads_one_commit_then_nothing_changed(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    with HubStandIn(TOKEN, lfs_threshold=LFS_THRESHOLD, lifetime_s=300) as hub:
        code, output = publish_to(hub, exported.folder, tmp_path)
        assert code == 0, output
        assert hub.problems == []
        lines = output.splitlines()
        assert lines[0] == f"created repository {REPO_ID}"
        commits = hub.commits(REPO_ID)
        assert [c.summary for c in commits] == [
            "initial commit",
            f"Upload FP8 EAGLE-3 draft (eaglequant {__version__}, validation passed (6/6 checks))",
        ]
        local = {
            p.name: p.read_bytes()
            for p in exported.folder.iterdir()
            if p.is_file() and p.name != "validation.json"
        }
        local["eaglequant.json"] = published_manifest(exported.folder)
        pushed = commits[-1]
        assert sorted(pushed.changed) == sorted(local)  # every file, in one commit
        assert lines[1] == f"committed {len(local)} of {len(local)} files to {REPO_ID}@main"
        for name, data in local.items():
            entry = pushed.tree[name]
            if len(data) >= LFS_THRESHOLD or name.endswith(".safetensors"):
                assert entry.lfs_oid == hashlib.sha256(data).hexdigest(), name
                assert entry.lfs_size == len(data) and hub.lfs[entry.lfs_oid] == data
            else:
                assert entry.lfs_oid is None and entry.data == data, name
        assert {n for n in local if pushed.tree[n].lfs_oid} == set(exported.shards())
        assert not hub.repos[REPO_ID].private
        manifest = json.loads(pushed.tree["eaglequant.json"].data or b"")
        assert (
            manifest["files"]
            == json.loads((exported.folder / "eaglequant.json").read_text())["files"]
        )
        assert (
            manifest["source"] == "<BF16_DRAFT>"
            and manifest["calibration"]["capture"]["data"] == "<CALIB_DATA>"
        )
        published = b"".join(pushed.tree[n].data or b"" for n in ("README.md", "eaglequant.json"))
        for name in (str(tmp_path), *LOCAL_NAMES):
            assert name.encode() not in published, name

        code, output = publish_to(hub, exported.folder, tmp_path)
        assert code == 0, output
        assert output.splitlines() == [
            f"nothing changed: the {len(local)} files on {REPO_ID}@main equal the local ones; "
            "no commit made"
        ]
        assert len(hub.commits(REPO_ID)) == 2
        assert [p for _, p in hub.requests if "/commit/" in p] == [
            f"/api/models/{REPO_ID}/commit/main"
        ]


def test_a_changed_card_is_committed_alone(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    with HubStandIn(TOKEN, lfs_threshold=LFS_THRESHOLD, lifetime_s=300) as hub:
        assert publish_to(hub, exported.folder, tmp_path, "--private")[0] == 0
        assert hub.repos[REPO_ID].private
        args = ["card", str(exported.folder), "--base-model", "toy/target", "--repo-id", REPO_ID]
        args += ["--validation", str(exported.validation), "--license", "mit"]
        assert CliRunner().invoke(main, args).exit_code == 0
        code, output = publish_to(hub, exported.folder, tmp_path, "--create-pr")
        assert code == 0, output
        assert (
            output.splitlines()[0]
            == f"committed 1 of {len(hub.commits(REPO_ID)[-1].tree) - 1} files to {REPO_ID}@main"
        )
        assert output.splitlines()[1] == f"{hub.url}/{REPO_ID}/discussions/1"
        assert hub.repos[REPO_ID].pulls[0].changed == ["README.md"]
        assert len(hub.commits(REPO_ID)) == 2  # main untouched: the change is a pull request


def test_publish_needs_a_token(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    with HubStandIn(TOKEN) as hub:
        code, output = publish_to(hub, exported.folder, tmp_path, token=None)
        assert code == 2
        assert output.splitlines()[-1] == (
            "error: no Hugging Face token: set HF_TOKEN or run `hf auth login` (dry run: --dry-run)"
        )
        assert hub.requests == []


def test_the_stand_in_rejects_bytes_that_do_not_match_their_oid() -> None:
    data, wrong = b"x" * 100, b"y" * 100
    oid = hashlib.sha256(data).hexdigest()
    with HubStandIn(TOKEN) as hub:
        hub.create_repo({"name": "r", "organization": "o"})
        batch = {
            "operation": "upload",
            "hash_algo": "sha256",
            "objects": [{"oid": oid, "size": 100}],
        }
        status, answer, _ = hub.lfs_batch(batch)
        assert status == 200
        href = answer["objects"][0]["actions"]["upload"]["href"]
        request = urllib.request.Request(href, data=wrong, method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400 and oid not in hub.lfs
        assert hub.problems == [
            f"LFS PUT {oid}: got sha256 {hashlib.sha256(wrong).hexdigest()}, 100 bytes"
        ]
        line = {
            "key": "lfsFile",
            "value": {"path": "m.safetensors", "algo": "sha256", "oid": oid, "size": 100},
        }
        header = {"key": "header", "value": {"summary": "s"}}
        status, _, _ = hub.commit(hub.repos["o/r"], "main", [header, line], create_pr=False)
        assert status == 422 and len(hub.commits("o/r")) == 1
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob


def test_a_missing_branch_is_refused_and_no_repository_created(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    with HubStandIn(TOKEN, lfs_threshold=LFS_THRESHOLD) as hub:
        code, output = publish_to(hub, exported.folder, tmp_path, "--revision", "dev")
        assert code == 2
        assert output.splitlines()[-1] == (
            f"error: {REPO_ID}: not on the Hub yet, so it has no branch 'dev'; "
            "publish to main first"
        )
        assert hub.repos == {}
        assert publish_to(hub, exported.folder, tmp_path)[0] == 0
        code, output = publish_to(hub, exported.folder, tmp_path, "--revision", "dev")
        assert code == 2
        assert output.splitlines()[-1] == (
            f"error: {REPO_ID}: no revision 'dev'; create the branch first or publish to main"
        )


def test_an_unreachable_hub_is_one_line_and_exit_1(tmp_path: Path) -> None:
    exported = carded(tmp_path)
    with HubStandIn(TOKEN) as hub:
        pass  # stopped: nothing listens at hub.url any more
    code, output = publish_to(hub, exported.folder, tmp_path)
    assert code == 1
    assert output.splitlines()[-1].startswith(f"error: {REPO_ID}: the upload failed: ")
