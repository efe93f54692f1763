"""The exception hierarchy: every error the tool reports on purpose.

Each error carries the exit code the CLI uses for it. Messages name what is
wrong (file, key or tensor), where, and how to fix it, on one line.
"""

from __future__ import annotations


class EagleQuantError(Exception):
    """Base class of the tool's own errors."""

    exit_code = 2


class InputError(EagleQuantError):
    """Bad input: a file, config, recipe or option the tool cannot use (exit 2)."""


class OutputError(EagleQuantError):
    """The output path cannot be written as asked (exit 2)."""


class CheckFailed(EagleQuantError):
    """A check ran and failed: inspect found problems, validation failed (exit 1)."""

    exit_code = 1


class ValidationFailed(CheckFailed):
    """A vLLM validation check failed (exit 1)."""


class EngineFailed(EagleQuantError):
    """An engine the tool started (vLLM, the target) failed or died before finishing (exit 1)."""

    exit_code = 1


class QuarkFailed(EagleQuantError):
    """Quark's own flow, run by the export in its worker process, failed (exit 1)."""

    exit_code = 1


class PublishFailed(EagleQuantError):
    """The Hub refused or failed an upload the checks allowed (exit 1)."""

    exit_code = 1


class FetchFailed(EagleQuantError):
    """A download the user asked for (``eaglequant prompts fetch``) failed (exit 1)."""

    exit_code = 1
