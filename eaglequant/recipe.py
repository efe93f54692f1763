"""Quantization recipes: YAML files under ``configs/`` loaded into one frozen, typed model.

Unknown keys and wrong types are refused with the file, the key path and the
accepted values. ``--recipe NAME`` finds ``configs/NAME.yaml``; a path works
too. ``eaglequant export --dump-recipe`` prints the resolved recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from eaglequant.errors import InputError

DEFAULT_RECIPE = "fp8-static"
FP8_E4M3_MAX = 448.0
MX_BLOCK = 32  # OCP MX: elements sharing one E8M0 scale, along the input dimension
MX_DTYPES = ("mxfp8_e4m3", "mxfp4")
E8M0_BIAS, E8M0_NAN = 127, 255  # an E8M0 scale byte e is 2 ** (e - 127); 255 is NaN

Dtype = Literal["fp8_e4m3", "mxfp8_e4m3", "mxfp4"]


@dataclass(frozen=True)
class WeightSpec:
    """How midlayer weights are quantized (always static).

    ``dtype`` FP8 E4M3 with a float32 scale per tensor or per output channel, or
    OCP MX (``mxfp8_e4m3``, ``mxfp4``) with one E8M0 scale per 32 input elements
    (``granularity: per_group``).
    """

    dtype: Dtype = "fp8_e4m3"
    granularity: Literal["per_tensor", "per_channel", "per_group"] = "per_tensor"


@dataclass(frozen=True)
class ActivationSpec:
    """How midlayer linear inputs are quantized (OCP MX: always dynamic, per 32 elements)."""

    dtype: Dtype = "fp8_e4m3"
    granularity: Literal["per_tensor", "per_token", "per_group"] = "per_tensor"
    dynamic: bool = False


@dataclass(frozen=True)
class KVCacheSpec:
    """The draft's KV cache scales. ``fp8_e4m3``: static per-tensor K and V scales calibrated
    with the input scales (the outputs of ``k_proj`` and ``v_proj``, before RoPE, as Quark
    writes and vLLM reads them); vLLM uses them when the draft's KV cache is FP8
    (``--draft-kv-cache-dtype``), which validate and compare then run. ``auto``: none."""

    dtype: Literal["auto", "fp8_e4m3"] = "auto"

    @property
    def scaled(self) -> bool:
        return self.dtype != "auto"


@dataclass(frozen=True)
class CalibrationSpec:
    """Calibration settings for static activation scales."""

    steps: int = 3
    samples: int = 64
    seq_len: int = 256
    held_out: int = 8
    batch_size: int = 4
    fixed_input_amax: float = 16.0
    # True: never calibrated; every static input scale is fixed_input_amax / 448 (ModelOpt's
    # quantize_drafter fixes amax at 448: input_scale 1.0). ``--calib none`` does this for any
    # static recipe at export; this makes it the recipe's own, for compare.
    fixed: bool = False


@dataclass(frozen=True)
class ValidationSpec:
    """Thresholds used by ``eaglequant validate``.

    Each ratio is judged by its bootstrap interval over prompts: the interval
    must clear it (``eaglequant.validate.stats.judge``).
    """

    min_acceptance_ratio: float = 0.98
    scale_tolerance: float = 1.25  # check 6: RMS error at most this x a calibrated scale's
    min_position_ratio: float = 0.95
    max_regression: float = 0.02
    min_category_drafts: int = 256  # a prompt category is judged from this many draft tokens


@dataclass(frozen=True)
class Recipe:
    """One quantization recipe (FP8 E4M3, symmetric, float32 scales)."""

    name: str
    description: str = ""
    weight: WeightSpec = field(default_factory=WeightSpec)
    activation: ActivationSpec = field(default_factory=ActivationSpec)
    kv_cache: KVCacheSpec = field(default_factory=KVCacheSpec)
    exclude: tuple[str, ...] = ("fc", "lm_head")
    scale_type: Literal["float32"] = "float32"
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    validation: ValidationSpec = field(default_factory=ValidationSpec)

    @property
    def needs_calibration(self) -> bool:
        return not self.activation.dynamic

    @property
    def direct_flow(self) -> bool:
        """Quark's file-to-file ``direct_quantize_checkpoint`` (FP8 with dynamic inputs) rather
        than ``quantize_model`` on the module (static inputs, and every OCP MX recipe: the
        direct flow has no per-group FP8)."""
        return self.activation.dynamic and not self.mx_weights

    @property
    def mx_weights(self) -> bool:
        """OCP MX weights: E8M0 scales per 32-element block (mxfp4 packs two values a byte)."""
        return self.weight.dtype in MX_DTYPES

    def scheme(self) -> str:
        """The one-line description of the format: ``W mxfp4 (per 32) / A fp8_e4m3 static``."""
        w, a = self.weight, self.activation
        mode = "dynamic" if a.dynamic else "static"
        w_part = f"{w.dtype} per {MX_BLOCK}" if self.mx_weights else f"{w.dtype} {w.granularity}"
        a_gran = f"per {MX_BLOCK}" if a.granularity == "per_group" else a.granularity
        kv = f" / KV {self.kv_cache.dtype} static" if self.kv_cache.scaled else ""
        return f"W {w_part} / A {a.dtype} {a_gran} {mode}{kv}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["exclude"] = list(self.exclude)
        return data


def builtin_recipes() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml")
        for p in resources.files("eaglequant.configs").iterdir()
        if p.name.endswith(".yaml")
    )


def resolve_recipe_path(name_or_path: str) -> Path:
    """A recipe name (``fp8-static``) or a YAML path -> the file to read."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise InputError(f"{candidate}: no such recipe file; built-in: {builtin_recipes()}")
        return candidate
    builtin = resources.files("eaglequant.configs") / f"{name_or_path}.yaml"
    if not builtin.is_file():
        raise InputError(
            f"recipe {name_or_path!r}: unknown; use one of {builtin_recipes()} or a YAML path"
        )
    return Path(str(builtin))


def load_recipe(name_or_path: str = DEFAULT_RECIPE) -> Recipe:
    """Load and check a recipe; InputError names the file and key on any problem."""
    # lazy: --help latency
    import yaml

    path = resolve_recipe_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid YAML ({exc}); fix the recipe file") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: a recipe must be a YAML mapping of keys to values")
    return recipe_from_dict(data, str(path))


def recipe_from_dict(data: dict[str, Any], origin: str) -> Recipe:
    """A recipe from its YAML or :meth:`Recipe.to_dict` form, checked; errors name ``origin``."""
    recipe = _build(Recipe, data, origin, "")
    _check_values(recipe, origin)
    return recipe


def _build(cls: Any, data: dict[str, Any], path: str, prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise InputError(
                f"{path}: unknown key '{prefix}{key}'; known keys here: {sorted(known)}"
            )
    values = {
        key: _convert(hints[key], value, path, f"{prefix}{key}") for key, value in data.items()
    }
    return cls(**values)


def _convert(hint: Any, value: Any, path: str, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise InputError(f"{path}: '{key}' must be a mapping, got {value!r}")
        return _build(hint, value, path, f"{key}.")
    origin = get_origin(hint)
    if origin is Literal:
        if value not in get_args(hint):
            raise InputError(
                f"{path}: '{key}' must be one of {list(get_args(hint))}, got {value!r}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{path}: '{key}' must be a list of strings, got {value!r}")
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise InputError(f"{path}: '{key}' must be {hint.__name__}, got {value!r}")
    return value


def _check_values(recipe: Recipe, path: str) -> None:
    calib = recipe.calibration
    for key in ("steps", "samples", "seq_len", "batch_size"):
        if getattr(calib, key) < 1:
            raise InputError(f"{path}: 'calibration.{key}' must be at least 1")
    if calib.held_out < 0 or calib.fixed_input_amax <= 0:
        raise InputError(f"{path}: 'calibration.held_out' >= 0 and 'fixed_input_amax' > 0 required")
    if recipe.activation.granularity == "per_token" and not recipe.activation.dynamic:
        raise InputError(f"{path}: 'activation.granularity: per_token' requires 'dynamic: true'")
    if calib.fixed and (recipe.activation.dynamic or recipe.kv_cache.scaled):
        raise InputError(
            f"{path}: 'calibration.fixed: true' fixes static input scales; it needs "
            "'activation.dynamic: false' and no scaled KV cache"
        )
    if recipe.kv_cache.scaled and not recipe.needs_calibration:
        raise InputError(
            f"{path}: 'kv_cache.dtype: {recipe.kv_cache.dtype}' calibrates K and V scales with "
            "the input scales; it needs static inputs ('activation.dynamic: false')"
        )
    _check_formats(recipe, path)
    validation = recipe.validation
    for key in ("min_acceptance_ratio", "min_position_ratio"):
        if not 0 < getattr(validation, key) <= 1.5:
            raise InputError(f"{path}: 'validation.{key}' must be in (0, 1.5]")
    if not 0 <= validation.max_regression < 1:
        raise InputError(f"{path}: 'validation.max_regression' must be in [0, 1)")
    if validation.scale_tolerance <= 1:
        raise InputError(f"{path}: 'validation.scale_tolerance' must be above 1")
    if validation.min_category_drafts < 1:
        raise InputError(f"{path}: 'validation.min_category_drafts' must be at least 1")


def _check_formats(recipe: Recipe, path: str) -> None:
    """Each dtype with the granularities it has: OCP MX is per 32-element group, FP8 is not."""
    for part, spec in (("weight", recipe.weight), ("activation", recipe.activation)):
        mx = spec.dtype in MX_DTYPES
        if mx != (spec.granularity == "per_group"):
            raise InputError(
                f"{path}: '{part}.granularity: per_group' goes with an OCP MX dtype "
                f"({', '.join(MX_DTYPES)}) and only with one, got dtype {spec.dtype!r} "
                f"and granularity {spec.granularity!r}"
            )
    act = recipe.activation
    if act.dtype in MX_DTYPES and not act.dynamic:
        raise InputError(
            f"{path}: 'activation.dtype: {act.dtype}' requires 'dynamic: true' "
            "(vLLM computes OCP MX input scales on the fly; it refuses static ones)"
        )
    weight = recipe.weight.dtype
    if act.dtype in MX_DTYPES and act.dtype != weight:
        raise InputError(
            f"{path}: 'activation.dtype: {act.dtype}' needs 'weight.dtype: {act.dtype}'; "
            "vLLM's QuarkOCP_MX pairs OCP MX inputs with weights of the same dtype only"
        )
    static_fp8_input = act.dtype == "fp8_e4m3" and not act.dynamic
    if weight == "mxfp8_e4m3" and static_fp8_input:
        raise InputError(
            f"{path}: 'weight.dtype: mxfp8_e4m3' with static FP8 inputs: vLLM refuses it "
            '("Quark model\'s OCP MX quantization is incompatible with static input scales"); '
            "use 'activation.dynamic: true' or 'weight.dtype: mxfp4' (its W4A8 scheme)"
        )
    if weight == "mxfp4" and static_fp8_input and act.granularity != "per_tensor":
        raise InputError(
            f"{path}: vLLM's W4A8 MXFP4/FP8 scheme takes static inputs per tensor only"
        )
