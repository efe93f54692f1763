"""A prompts argument (a file or ``NAME[:N]``) and the prompts it stands for.

:func:`parse_source` is light (no file is read) so option parsing can use it;
:func:`load_prompts` reads the file or the installed set and returns a
:class:`PromptSet`: the prompts and what identifies them in a report.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.prompts.cache import load, prompts_dir, write_atomically
from eaglequant.prompts.format import Prompt, PromptSetRecord, read_prompt_file, text_hash
from eaglequant.prompts.registry import SETS

_SET_NAME = re.compile(r"^(?P<name>[A-Za-z0-9_-]+)(?::(?P<limit>[^:]*))?$")


@dataclass(frozen=True)
class PromptSource:
    """A prompts file, or a named set with an optional limit (its first ``limit`` prompts)."""

    path: Path | None = None
    name: str | None = None
    limit: int | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        return f"{self.name}:{self.limit}" if self.limit else str(self.name)


@dataclass(frozen=True)
class PromptSet:
    """Prompts and their provenance: the source as given, and the read file's sha256."""

    source: str
    sha256: str
    prompts: list[Prompt]

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.prompts]

    @property
    def categories(self) -> list[str] | None:
        """Each prompt's category, or None when no prompt has one."""
        if all(p.category is None for p in self.prompts):
            return None
        return [p.category or "uncategorised" for p in self.prompts]

    @property
    def followups(self) -> list[str | None] | None:
        """Each prompt's second turn (None where it has none), or None when no prompt has one."""
        if all(p.followup is None for p in self.prompts):
            return None
        return [p.followup for p in self.prompts]

    def describe(self) -> PromptSetRecord:
        return {"source": self.source, "sha256": self.sha256, "prompts": len(self.prompts)}


def set_names() -> str:
    return ", ".join(SETS)


def parse_source(text: str) -> PromptSource:
    """``mt-bench``, ``sharegpt:100`` or a path; InputError for an unknown name or a bad N.

    A value that is an existing path, or has a suffix or a folder in it, is a file.
    """
    path = Path(text)
    match = _SET_NAME.match(text)
    if path.exists() or match is None or path.suffix:
        return PromptSource(path=path)
    name, limit = match["name"], match["limit"]
    if name not in SETS:
        raise InputError(
            f"prompt set {name!r}: unknown; use one of {set_names()} (NAME:N for the first N) "
            "or a .jsonl/.txt prompts file"
        )
    if limit is None:
        return PromptSource(name=name)
    if not limit.isdigit() or int(limit) < 1:
        raise InputError(f"prompt set {text!r}: N must be a positive integer, e.g. {name}:100")
    return PromptSource(name=name, limit=int(limit))


def load_prompts(source: PromptSource) -> PromptSet:
    """The prompts ``source`` names, checked; a set's file must be installed and unchanged."""
    if source.path is not None:
        prompts = read_prompt_file(source.path)
        digest = hashlib.sha256(source.path.read_bytes()).hexdigest()
        return PromptSet(str(source), digest, prompts)

    assert source.name is not None
    spec = SETS[source.name]
    data, digest = load(spec)
    prompts = spec.parse(data, spec.filename)
    if source.limit is not None:
        if source.limit > len(prompts):
            raise InputError(
                f"prompt set {source}: {source.name} holds {len(prompts)} prompts; "
                f"ask for at most {source.name}:{len(prompts)}"
            )
        prompts = prompts[: source.limit]
    return PromptSet(str(source), digest, prompts)


def text_hashes(texts: list[str]) -> list[str]:
    return [text_hash(t) for t in texts]


def prompts_as_file(source: PromptSource) -> Path:
    """A set's prompts as a ``.jsonl`` of ``{"prompt": ...}`` in the cache (for other tools)."""
    prompts = load_prompts(source)
    folder = prompts_dir() / "files"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{source.name}-{source.limit or 'all'}.jsonl"
    lines = "".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts.prompts)
    write_atomically(path, lines.encode("utf-8"))
    return path


def bench_dataset_file(source: PromptSource | Path, dataset: str | None) -> Path:
    """The file ``vllm bench serve`` reads for ``source``: a file as given; the set ``sharegpt``
    under ``--dataset sharegpt`` as the installed ShareGPT file itself (sha256-checked, read by
    vLLM's own ShareGPT loader); any other set as a ``.jsonl`` of its prompts."""
    if isinstance(source, Path):
        return source
    if source.path is not None:
        return source.path
    if dataset == "sharegpt" and source.name == "sharegpt":
        spec = SETS["sharegpt"]
        load(spec)  # InputError naming the fetch step when absent or changed
        return prompts_dir() / spec.filename
    return prompts_as_file(source)
