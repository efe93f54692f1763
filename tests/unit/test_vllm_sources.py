"""Every vLLM hook holds in each vLLM release eaglequant declares, read from its wheel.

``tests/vllm_sources/`` holds, per release, the lines of its wheel (pinned by sha256) that
define each hook of ``engine/vllm_internals.py``, written by ``regenerate.py`` beside them.
Here eaglequant's own source probe (``engine/vllm_source.py``) reads those lines in place
of an installed vLLM: no vLLM is imported or downloaded. A hook added without its excerpts,
a hook whose member or parameters no release has, or a range wider than the releases read
fails here.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib

from eaglequant.engine import vllm_internals as internals
from eaglequant.engine import vllm_source

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "tests" / "vllm_sources"
RELEASES = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in SOURCES.glob("*.json")}
FIX = "run tests/vllm_sources/regenerate.py"


def _regenerate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regenerate", SOURCES / "regenerate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the pins; downloads nothing until main()
    return module


def _excerpt(release: str, hook: internals.Hook) -> str:
    entry = RELEASES[release]["hooks"].get(hook.key)
    assert entry is not None, f"{release}: no excerpt for hook {hook.key} ({FIX})"
    assert entry["file"] == hook.file, f"{release}: {hook.key} read from {entry['file']} ({FIX})"
    assert entry["lines"], f"vLLM {release} does not define {hook.owner}.{hook.member}"
    return "\n".join(text for _number, text in entry["lines"])


def _probe_reads(monkeypatch: pytest.MonkeyPatch, module: str, text: str) -> None:
    """The source probe reads ``text`` as ``module``'s source, and finds no other module."""
    tree = ast.parse(text)
    monkeypatch.setattr(vllm_source, "_source", lambda m: tree if m == module else None)


def test_each_pinned_wheel_has_its_excerpts_and_no_other() -> None:
    pins = {f"{d}-{v}": (d, v, sha) for d, v, sha in _regenerate().WHEELS}
    assert sorted(RELEASES) == sorted(pins), FIX
    for name, record in RELEASES.items():
        assert (record["distribution"], record["version"], record["sha256"]) == pins[name]
        assert record["wheel"].endswith(".whl")


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_excerpts_are_of_every_hook_and_no_other(release: str) -> None:
    keys = {hook.key for hook in internals.HOOKS}
    recorded = set(RELEASES[release]["hooks"])
    assert sorted(keys - recorded) == [], f"hooks without an excerpt in {release} ({FIX})"
    assert sorted(recorded - keys) == [], f"excerpts of no hook in {release} ({FIX})"


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("hook", internals.HOOKS, ids=lambda h: h.key)
def test_the_hook_holds_in_the_release(
    release: str, hook: internals.Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    _probe_reads(monkeypatch, hook.owner.split(":")[0], _excerpt(release, hook))
    assert internals.missing_hooks((hook.key,)) == [], f"vLLM {release}: {hook.owner}"


def test_an_excerpt_without_the_member_or_its_parameters_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = max(RELEASES, key=lambda name: RELEASES[name]["version"])
    for key, before, after in [
        ("v1.drafter", "self.drafter", "self.proposer"),
        ("v1.proposer.load_model", "target_model", "model"),
    ]:
        hook = internals.BY_KEY[key]
        text = _excerpt(release, hook)
        assert before in text
        _probe_reads(monkeypatch, hook.owner.split(":")[0], text.replace(before, after))
        assert internals.missing_hooks((key,)) == [hook]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_declared_range_is_the_releases_read() -> None:
    versions = sorted({r["version"] for r in RELEASES.values()}, key=_minor)
    assert list(internals.READ_IN) == versions
    assert all(internals.version_warning(v) == "" for v in versions)
    floor, ceiling = (_minor(v) for v in internals.SUPPORTED)
    minors = {_minor(v) for v in versions}
    claimed = {(floor[0], m) for m in range(floor[1], ceiling[1])} if floor[0] == ceiling[0] else {}
    assert claimed and claimed <= minors, f"{internals.SUPPORTED} claims minors none was read in"
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = f"vllm>={internals.SUPPORTED[0]},<{internals.SUPPORTED[1]}"
    assert project["optional-dependencies"]["vllm"] == [extra]
