"""The command line a result was made with, as a reader can rerun it: no machine paths.

Export, validate and tune record how they were invoked (the manifest's, the
validation report's and the tuning results' ``command``); the model card prints
them under *Reproduce*. Every path the command was given becomes a named
placeholder (``<BF16_DRAFT>``, ``<TARGET>``, ...), and any other absolute path
left in an argument becomes ``<PATH>``, so nothing of the machine is published.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

# Placeholders by command and parameter; any other path parameter is named after itself.
PLACEHOLDERS: dict[str, dict[str, str]] = {
    "export": {"src": "<BF16_DRAFT>", "out": "<FP8_DRAFT>"},
    "validate": {"draft": "<FP8_DRAFT>", "baseline": "<BF16_DRAFT>"},
    "tune": {"draft": "<FP8_DRAFT>", "out": "<TUNE_OUT>"},
    "capture": {"out": "<CAPTURE>"},
}
COMMON = {
    "target": "<TARGET>",
    "calib_target": "<TARGET>",
    "calib_data": "<CALIB_DATA>",
    "calib_hidden_states": "<CAPTURE>",
    "hidden_states": "<CAPTURE>",
    "prompts": "<PROMPTS>",
    "json_path": "<REPORT_JSON>",
    "markdown_path": "<REPORT_MD>",
}
PLACEHOLDER = re.compile(r"<[A-Z0-9_]+>")
# An absolute path: a slash not preceded by a word character, a colon or another slash
# (so URLs and ratios like "tok/s" are left alone), then at least one named segment.
# A home-relative path, or an absolute one of two or more parts (``/metrics``, an HTTP
# endpoint named in reports, is not a machine path).
ABSOLUTE_PATH = re.compile(
    r"(?<![\w:/.~-])(?:~/[\w.+@-]+(?:/[\w.+@-]+)*|/[\w.+@-]+(?:/[\w.+@-]+)+)/?"
)


def placeholder(command: str, parameter: str) -> str:
    """The placeholder for one path parameter of ``command``."""
    named = PLACEHOLDERS.get(command, {}).get(parameter) or COMMON.get(parameter)
    return named or f"<{parameter.upper()}>"


def command_string(
    argv: Sequence[str], paths: Mapping[Path, str], program: str = "eaglequant"
) -> str:
    """``argv`` (without the program) as one shell line, each given path its placeholder.

    ``paths`` maps each path value the command received to its placeholder; an argument
    naming it (``--draft X`` or ``--draft=X``) is replaced, any absolute path left inside an
    argument becomes ``<PATH>``.
    """
    resolved = {_key(p): name for p, name in paths.items()}
    words = [program]
    for arg in argv:
        option, equals, value = arg.partition("=")
        if equals and option.startswith("--") and _key(Path(value)) in resolved:
            words.append(f"{option}={resolved[_key(Path(value))]}")
        elif arg and _key(Path(arg)) in resolved:
            words.append(resolved[_key(Path(arg))])
        else:
            words.append(_quote(ABSOLUTE_PATH.sub("<PATH>", arg)))
    return " ".join(words)


def _key(path: Path) -> str:
    try:
        return str(path.expanduser().resolve())
    except (OSError, RuntimeError):
        return str(path)


def _quote(word: str) -> str:
    """Shell-quote, leaving placeholders readable when they are the whole word."""
    return word if PLACEHOLDER.fullmatch(word) else shlex.quote(word)


def machine_paths(text: str) -> list[str]:
    """Absolute paths (``/...`` or ``~/...``) in ``text``: what a published text must not hold."""
    return ABSOLUTE_PATH.findall(text)
