"""Committed files speak of the project: no path of the machine a result was made on, no
history dated other than by date, commit or version.

Every text file git tracks is read line by line. A line fails when it holds an absolute
path of a machine (a home folder, a temporary folder, a work tree, this checkout's own
path) or dates something by session. Documented system paths (the C library's folder,
the kernel's proc files, shared memory) name no machine and pass. Test inputs that feed
code a machine path on purpose, to show it is kept out of the output, are listed below.
"""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

SESSION = re.compile(r"session [0-9]|sessions [0-9]|working +sessions|session[0-9]", re.I)
# A home folder, a temporary folder or a work tree, not inside a URL or a relative path.
# (The slash comes first and the lookbehind after it, so a scan skips everything else fast.)
MACHINE_PATH = re.compile(
    r"/(?<![\w./~$-]/)"
    r"(?:(?:root|home/[\w.-]+|Users/[\w.-]+)(?![\w.-])"
    r"|(?:tmp|var/tmp|var/folders|private/var/folders|private/tmp|work)/[\w.$-]+)"
    r"(?:/[\w.$-]+)*"
)
BINARY_SUFFIXES = (".safetensors", ".png", ".gguf", ".bin", ".pt")
# Test inputs (written without their leading slash): paths a test hands to the code
# that must keep machine paths out of what it writes.
TEST_INPUTS = {
    "tests/unit/test_acceptance_checks.py": {"tmp/x1"},
    "tests/unit/test_card_binding.py": {"var/tmp/somewhere-else/engine.log", "tmp/x"},
    "tests/unit/test_environment.py": {"root"},
}


def problems(name: str, text: str, checkout: str = str(REPO)) -> list[str]:
    """``name:line: what`` for each machine path or session date in ``text``."""
    if "session" not in text.lower() and checkout not in text and not MACHINE_PATH.search(text):
        return []
    allowed = TEST_INPUTS.get(name, set())
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        paths = [p for p in MACHINE_PATH.findall(line) if p.lstrip("/") not in allowed]
        if len(checkout) > 1 and checkout in line and not paths:
            paths.append(checkout)
        for path in paths:
            found.append(f"{name}:{number}: machine path {path}: {line.strip()[:120]}")
        for match in SESSION.finditer(line):
            found.append(f"{name}:{number}: '{match.group()}': {line.strip()[:120]}")
    return found


def tracked_texts() -> dict[str, str]:
    """Every text file git tracks in this checkout, by its path in the repository."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    texts = {}
    for name in filter(None, listing.split("\0")):
        path = REPO / name
        if name.endswith(BINARY_SUFFIXES) or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data[:8192]:
            texts[name] = data.decode("utf-8", errors="replace")
    return texts


def test_no_committed_file_names_a_machine_path_or_a_session() -> None:
    texts = tracked_texts()
    assert len(texts) > 100, f"git ls-files found {len(texts)} text files in {REPO}"
    found = [line for name, text in sorted(texts.items()) for line in problems(name, text)]
    assert not found, (
        "committed files name a machine path or date by session (use a path relative to "
        "the checkout or a placeholder; date by date and commit):\n" + "\n".join(found)
    )


def test_the_scan_names_the_file_and_line_of_each_kind() -> None:
    slash, session = "/", "session"  # split, so this file holds no planted line itself
    planted = [
        f"prompts {slash}work/main/bench/.cache/tune-prompts.jsonl",
        f'"target": "{slash}home/alice/models/target"',
        f"HOME={slash}root",
        f"written to {slash}tmp/tmpab12cd/out.json",
        f"cache {slash}var/folders/xy/T/cache",
        f"measured at {slash}srv/checkout/bench",
        f"Before the lookup ({session.title()} 18, same bench)",
        f"as in {session}s 2, 5 and 6",
        f"the first six working {session}s",
    ]
    found = problems("docs/x.md", "\n".join(planted), checkout=f"{slash}srv/checkout")
    assert [line.split(": ", 1)[0] for line in found] == [f"docs/x.md:{n}" for n in range(1, 10)]
    assert found[0].startswith(f"docs/x.md:1: machine path {slash}work/main/bench/.cache/tune")
    assert found[6].startswith(f"docs/x.md:7: '{session.title()} 1'")


def test_documented_system_paths_and_relative_ones_pass() -> None:
    slash = "/"
    fine = [
        f"vLLM reads {slash}proc/cpuinfo and maps {slash}usr/lib/libgomp.so; {slash}dev/shm",
        "out/pair/target, bench/.cache/tune-prompts.jsonl, 52.3 tok/s",
        "https://huggingface.co/tmp/models and https://example.org/work/x",
        "a session fixture; the fork server's own session; 2026-12-04 (9e07d40)",
    ]
    assert problems("docs/x.md", "\n".join(fine), checkout=f"{slash}srv/checkout") == []
    assert problems("tests/unit/test_card_binding.py", f"see {slash}tmp/x") == []
    assert problems("docs/x.md", f"see {slash}tmp/x") != []
