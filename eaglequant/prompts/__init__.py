"""Prompts for validation, tuning and calibration: prompt files and named prompt sets.

A prompts argument is either a file (``.jsonl`` or ``.txt``, :mod:`.records`) or
a named set from the registry (``mt-bench``, ``humaneval``, ``sharegpt``,
optionally ``:N`` for the first N, :mod:`.registry`). Sets are installed once
with ``eaglequant prompts fetch`` into a local cache (:mod:`.cache`) and read
from there, their sha256 checked on every load; nothing is downloaded at run
time. :mod:`.chat` renders prompts with the target's chat template.
"""
