"""vLLM's module-name matching, as its quantization configs apply it to a draft's linears.

Each function is the torch-free twin of one vLLM function (vLLM 0.32,
``model_executor/layers/quantization/``), held to it by the integration tests:

- :func:`find_matching_patterns`: ``utils/config_utils.find_matching_patterns`` (an entry
  equals the name, or is ``re:<pattern>`` matched with ``re.match``; with ``use_fnmatch``
  also a shell pattern); a fused layer is matched directly or through every shard.
- :func:`should_ignore_layer`: ``quark/utils.should_ignore_layer`` and
  ``compressed_tensors/utils.should_ignore_layer`` (the same rule): ignored when every
  shard is, refused (``ValueError``, vLLM's words) when only some are.
- :func:`find_matched_target`: ``compressed_tensors/utils.find_matched_target`` (the
  name, then every shard, then the vLLM module's class name as a case-blind substring).
- :func:`is_layer_skipped`: ``utils/quant_utils.is_layer_skipped`` in its exact mode
  (``fp8``'s ``ignored_layers``, ModelOpt's first test).
- :func:`modelopt_excluded`: ``modelopt.ModelOptQuantConfigBase.is_layer_excluded`` (exact,
  then substring, then ``fnmatch``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatch


def is_equal_or_regex_match(
    value: str, target: str, check_contains: bool = False, use_fnmatch: bool = False
) -> bool:
    """vLLM's ``is_equal_or_regex_match``."""
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    if check_contains:
        return target.lower() in value.lower()
    return target == value or (use_fnmatch and fnmatch(value, target))


def shard_names(name: str, fused: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """The checkpoint-side names of a fused vLLM layer's shards (None: not fused)."""
    proj = name.split(".")[-1]
    if proj not in fused:
        return None
    return [name.replace(proj, shard) for shard in fused[proj]]


def find_matching_patterns(
    name: str,
    patterns: Iterable[str],
    fused: Mapping[str, tuple[str, ...]],
    use_fnmatch: bool = False,
) -> list[set[str]]:
    """The patterns matching ``name`` directly (one set), else one set per shard."""
    patterns = list(patterns)
    direct = {p for p in patterns if is_equal_or_regex_match(name, p, use_fnmatch=use_fnmatch)}
    if direct:
        return [direct]
    shards = shard_names(name, fused)
    if shards is None:
        return [set()]
    return [
        {p for p in patterns if is_equal_or_regex_match(s, p, use_fnmatch=use_fnmatch)}
        for s in shards
    ]


def should_ignore_layer(
    name: str, ignore: Iterable[str], fused: Mapping[str, tuple[str, ...]]
) -> bool:
    """Quark's and compressed-tensors' rule; ValueError when only some shards match."""
    shards_ignored = [bool(m) for m in find_matching_patterns(name, ignore, fused)]
    if any(shards_ignored) and not all(shards_ignored):
        raise ValueError(
            f"Found different quantization schemes for the shards of {name}. "
            "vLLM requires all to use the same scheme."
        )
    return all(shards_ignored)


def find_matched_target(
    name: str, module_class: str, targets: Iterable[str], fused: Mapping[str, tuple[str, ...]]
) -> str | None:
    """The compressed-tensors target that applies to ``name`` (built as ``module_class``)."""
    targets = list(targets)
    direct = next((t for t in targets if is_equal_or_regex_match(name, t)), None)
    if direct is not None:
        return direct
    shards = shard_names(name, fused)
    if shards is not None:
        per_shard = [
            next((t for t in targets if is_equal_or_regex_match(s, t)), None) for s in shards
        ]
        if all(per_shard):
            return per_shard[0]
    return next((t for t in targets if is_equal_or_regex_match(module_class, t, True)), None)


def is_layer_skipped(
    name: str, ignored: Iterable[str], fused: Mapping[str, tuple[str, ...]]
) -> bool:
    """vLLM's exact-mode ``is_layer_skipped``; ValueError when only some shards are listed."""
    ignored = list(ignored)
    shards = shard_names(name, fused)
    if shards is None or name in ignored:
        return name in ignored
    skipped = [s in ignored for s in shards]
    if any(skipped) and not all(skipped):
        raise ValueError(
            f"Detected some but not all shards of {name} are quantized. All shards of fused "
            "layers to have the same precision."
        )
    return all(skipped)


def modelopt_excluded(
    name: str, exclude_modules: Iterable[str], fused: Mapping[str, tuple[str, ...]]
) -> bool:
    """ModelOpt's ``is_layer_excluded``: exact (with shards), substring, then ``fnmatch``."""
    exclude = list(exclude_modules)
    if not exclude:
        return False
    if is_layer_skipped(name, exclude, fused):
        return True
    for entry in exclude:
        if entry != name and (
            entry in name
            or (
                name.startswith("language_model.") and entry in name.removeprefix("language_model.")
            )
        ):
            return True
    return any(fnmatch(name, entry) for entry in exclude)
