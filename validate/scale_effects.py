"""What an FP8 E4M3 scale does to the values it quantizes: check 6's arithmetic, in plain torch.

Activations are not kept: each linear's inputs (and the K/V projections' outputs) are summed
into a :class:`Magnitudes` histogram of |x| while the draft runs, 16 equal-width bins per
binade (power of two), in float64. Each bin holds its count of values and, for the SQNR,
their count, sum and sum of squares each weighted by 1 / the power of the value's row (one
token's vector): a token whose values are huge (the attention-sink token's massive
activations) then weighs what any other token weighs, instead of all the power there is.
From it, :func:`input_effect` says what a static scale ``s`` does to those values, as
vLLM's static FP8 input quantization does it (``x / s`` clamped to +-448, rounded to E4M3):

* **clipped**: the fraction of values with |x| > 448 s, whose error is |x| - 448 s (exact,
  from the bin sums);
* **underflow**: the fraction of nonzero values below the smallest normal, 2^-6 s: E4M3's
  subnormals keep an absolute step of 2^-9 s, and below 2^-10 s a value becomes 0;
* the rounding error of the normal values, a step of 2^(e-3) s in binade ``e`` (3 mantissa
  bits), taken as uniform: the step squared over 12 per value;
* **SQNR**: per token, its values' power over its error's; the mean of that ratio's inverse
  over tokens, in dB (each drafted token sees its own row's error).

A bin that straddles one of those boundaries is split in proportion to its width (values
taken as uniform within a bin); ``tests/unit/test_scale_effects.py`` holds the estimate to
the exact E4M3 cast of in-code tensors. The same numbers for the calibrated scale,
amax / 448 of the very same values, are what the draft's scale is judged against.

Weights are judged exactly: :func:`dequantize` rebuilds the weight vLLM multiplies with from
the stored E4M3 values and whatever scale layout the checkpoint holds (per tensor, per
output channel, per 2-D block, OCP MX), or says why it cannot; :func:`weight_effect`
compares it with the BF16 baseline's weight and with a calibrated per-tensor E4M3 rounding
of that weight (an MX weight: the MX rounding of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from eaglequant.recipe import FP8_E4M3_MAX, MX_BLOCK

if TYPE_CHECKING:
    from eaglequant.results.engine_result import MagnitudesJson

BINS_PER_BINADE = 16
LOWEST_BINADE = -150  # float32's smallest subnormal is 2^-149
BINADES = 128 - LOWEST_BINADE  # float32's largest finite value is below 2^128
SMALLEST_NORMAL = 2.0**-6  # E4M3's, x the scale
SUBNORMAL_STEP = 2.0**-9
FLUSH = 2.0**-10  # half the subnormal step: below it a value rounds to 0
MANTISSA_BITS = 3
TOP_BINADE = 8  # 448 = 1.75 x 2^8

Cause = Literal["clipping", "underflow"]


class Magnitudes:
    """A histogram of |x| over everything :meth:`add` was given (on the tensors' device)."""

    def __init__(self) -> None:
        size = BINADES * BINS_PER_BINADE
        self.count = torch.zeros(size, dtype=torch.float64)
        self.weights = torch.zeros(size, dtype=torch.float64)  # sum of 1 / row power
        self.total = torch.zeros(size, dtype=torch.float64)  # of |x| / row power
        self.squares = torch.zeros(size, dtype=torch.float64)  # of x^2 / row power
        self.row_amax = torch.zeros(size, dtype=torch.float64)  # rows by their largest |x|
        self.rows = 0
        self.zeros = 0
        self.nonfinite = 0
        self.amax = 0.0

    def add(self, x: torch.Tensor) -> None:
        """Values of rows along the last dimension (one token's vector a row)."""
        rows = x.detach().float().reshape(-1, x.shape[-1] if x.dim() else 1).abs()
        finite = rows.isfinite()
        self.nonfinite += int(rows.numel() - finite.sum())
        rows = torch.where(finite, rows, 0.0)
        power = rows.double().square().sum(-1, keepdim=True)
        live = rows > 0
        self.zeros += int(finite.sum() - live.sum())
        self.rows += int((power > 0).sum())
        positive = rows[live]
        if not positive.numel():
            return
        weight = (1 / power).expand_as(rows)[live]
        self._to(positive.device)
        index = _bin(positive)
        wide = positive.double()
        self.count.index_add_(0, index, torch.ones_like(wide))
        self.weights.index_add_(0, index, weight)
        self.total.index_add_(0, index, weight * wide)
        self.squares.index_add_(0, index, weight * wide * wide)
        largest = rows.amax(-1)
        largest = largest[largest > 0]
        self.row_amax.index_add_(0, _bin(largest), torch.ones_like(largest, dtype=torch.float64))
        self.amax = max(self.amax, float(positive.max()))

    def _to(self, device: torch.device) -> None:
        if self.count.device != device:
            self.count, self.weights, self.total, self.squares, self.row_amax = (
                t.to(device)
                for t in (self.count, self.weights, self.total, self.squares, self.row_amax)
            )

    def to_json(self) -> MagnitudesJson:
        """The bins from the first to the last one holding a value (as the report keeps it)."""
        held = self.count.nonzero().flatten().tolist()
        first, last = (held[0], held[-1] + 1) if held else (0, 0)
        return {
            "bins_per_binade": BINS_PER_BINADE,
            "first_binade": LOWEST_BINADE,
            "first": first,
            "count": self.count[first:last].tolist(),
            "weights": self.weights[first:last].tolist(),
            "sum": self.total[first:last].tolist(),
            "sum_squares": self.squares[first:last].tolist(),
            "row_amax": self.row_amax[first:last].tolist(),
            "rows": self.rows,
            "zeros": self.zeros,
            "nonfinite": self.nonfinite,
            "amax": self.amax,
        }


def merge(histograms: list[MagnitudesJson]) -> MagnitudesJson:
    """Several histograms of the same layout as one (a fused part seen by several hooks)."""
    merged = Magnitudes()
    for h in histograms:
        _check_layout(h)
        start = h["first"]
        stop = start + len(h["count"])
        for mine, key in (
            (merged.count, "count"),
            (merged.weights, "weights"),
            (merged.total, "sum"),
            (merged.squares, "sum_squares"),
            (merged.row_amax, "row_amax"),
        ):
            mine[start:stop] += torch.tensor(h[key], dtype=torch.float64)  # type: ignore[literal-required]
        merged.rows += h["rows"]
        merged.zeros += h["zeros"]
        merged.nonfinite += h["nonfinite"]
        merged.amax = max(merged.amax, h["amax"])
    return merged.to_json()


def _bin(positive: torch.Tensor) -> torch.Tensor:
    """Each positive value's bin: its binade, then which of its 16 equal parts."""
    mantissa, exponent = torch.frexp(positive)  # positive = mantissa x 2^exponent
    within = ((mantissa * 2 - 1) * BINS_PER_BINADE).long().clamp(0, BINS_PER_BINADE - 1)
    return (exponent.long() - 1 - LOWEST_BINADE) * BINS_PER_BINADE + within


def _check_layout(h: MagnitudesJson) -> None:
    if (h["bins_per_binade"], h["first_binade"]) != (BINS_PER_BINADE, LOWEST_BINADE):
        raise ValueError(
            f"a histogram of {h['bins_per_binade']} bins per binade from 2^{h['first_binade']}; "
            f"this check reads {BINS_PER_BINADE} from 2^{LOWEST_BINADE}"
        )


@dataclass(frozen=True)
class InputEffect:
    """What one static scale does to a histogram's values (fractions of all its values)."""

    scale: float
    clipped: float
    underflow: float
    tokens_clipped: float  # fraction of tokens (rows) with a value clipped
    sqnr_db: float  # over every token
    unclipped_sqnr_db: float  # over the tokens it does not clip
    clip_error: float  # the error power's share from clipping
    underflow_error: float  # its share from values below the smallest normal

    @property
    def cause(self) -> Cause:
        """Which of the two a scale's excess error comes from (a scale only moves the range)."""
        return "clipping" if self.clip_error >= self.underflow_error else "underflow"


def input_effect(h: MagnitudesJson, scale: float) -> InputEffect:
    """The FP8 E4M3 error of quantizing the histogram's values with ``scale``."""
    _check_layout(h)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the scale {scale!r} is not finite positive")
    if not h["rows"]:
        raise ValueError("no nonzero value was observed")
    regions = _regions(scale)
    clip_at = FP8_E4M3_MAX * scale
    error = {"clip": 0.0, "under": 0.0, "round": 0.0}
    counts = {"clip": 0.0, "under": 0.0, "round": 0.0}
    bins = zip(h["count"], h["weights"], h["sum"], h["sum_squares"], strict=True)
    for i, (n, w, s1, s2) in enumerate(bins):
        if not n:
            continue
        low, high = _bin_bounds(h["first"] + i)
        high = min(high, h["amax"]) if low <= h["amax"] < high else high
        for kind, share, err in _bin_error(low, high, w, s1, s2, regions, clip_at):
            counts[kind] += n * share
            error[kind] += err
    values = sum(h["count"]) + h["zeros"]
    noise = sum(error.values())
    clipped_rows = _rows_above(h, clip_at)
    return InputEffect(
        scale=scale,
        clipped=counts["clip"] / values,
        underflow=counts["under"] / values,
        tokens_clipped=clipped_rows / h["rows"],
        sqnr_db=_db(h["rows"], noise),
        unclipped_sqnr_db=_db(h["rows"] - clipped_rows, error["round"] + error["under"]),
        clip_error=error["clip"] / noise if noise else 0.0,
        underflow_error=error["under"] / noise if noise else 0.0,
    )


def _rows_above(h: MagnitudesJson, limit: float) -> float:
    """How many rows have their largest |x| above ``limit`` (a straddling bin split)."""
    above = 0.0
    for i, n in enumerate(h["row_amax"]):
        low, high = _bin_bounds(h["first"] + i)
        high = min(high, h["amax"]) if low <= h["amax"] < high else high
        if n and high > limit:
            above += n if low >= limit else n * (high - limit) / (high - low)
    return above


def calibrated_scale(h: MagnitudesJson) -> float:
    """The per-tensor scale a calibration on these very values gives: amax / 448."""
    return h["amax"] / FP8_E4M3_MAX


def _db(power: float, noise: float) -> float:
    if power <= 0:
        return -math.inf
    return 10 * math.log10(power / noise) if noise > 0 else math.inf


def _bin_bounds(index: int) -> tuple[float, float]:
    binade, within = divmod(index, BINS_PER_BINADE)
    base = 2.0 ** (binade + LOWEST_BINADE)
    return (
        base * (1 + within / BINS_PER_BINADE),
        base * (1 + (within + 1) / BINS_PER_BINADE),
    )


# A region of |x|: from its lower bound up, its kind and its rounding step (None: flushed to 0).
Region = tuple[float, str, float | None]


def _regions(scale: float) -> list[Region]:
    regions: list[Region] = [
        (0.0, "under", None),
        (FLUSH * scale, "under", SUBNORMAL_STEP * scale),
    ]
    for binade in range(int(math.log2(SMALLEST_NORMAL)), TOP_BINADE + 1):
        step = 2.0 ** (binade - MANTISSA_BITS) * scale
        regions.append((2.0**binade * scale, "round", step))
    regions.append((FP8_E4M3_MAX * scale, "clip", None))
    return regions


def _bin_error(
    low: float,
    high: float,
    w: float,
    s1: float,
    s2: float,
    regions: list[Region],
    clip_at: float,
) -> list[tuple[str, float, float]]:
    """(kind, share of the bin's values, weighted error power) of one bin's values, split
    where the regions split it (``w``, ``s1``, ``s2``: its weighted count, sum, squares)."""
    bounds = [r[0] for r in regions]
    pieces = []
    for k, (start, kind, step) in enumerate(regions):
        stop = bounds[k + 1] if k + 1 < len(bounds) else math.inf
        a, b = max(low, start), min(high, stop)
        if a >= b and not (low == high and start <= low < stop):
            continue
        if a <= low and b >= high:  # the whole bin: its own sums
            share, m0, m1, m2 = 1.0, w, s1, s2
        else:  # a piece: the values taken as uniform over the bin
            share = (b - a) / (high - low)
            m0 = w * share
            m1, m2 = m0 * (a + b) / 2, m0 * (a * a + a * b + b * b) / 3
        if kind == "clip":
            err = max(m2 - 2 * clip_at * m1 + m0 * clip_at * clip_at, 0.0)
        elif step is None:
            err = m2
        else:
            err = m0 * step * step / 12
        pieces.append((kind, share, err))
    return pieces


@dataclass(frozen=True)
class WeightEffect:
    """A dequantized weight against its BF16 baseline, and a calibrated rounding of it."""

    layout: str
    error: float  # relative RMS error: ||W_fp8 - W|| / ||W||
    calibrated_error: float

    @property
    def sqnr_db(self) -> float:
        return -20 * math.log10(self.error) if self.error > 0 else math.inf

    @property
    def calibrated_sqnr_db(self) -> float:
        return -20 * math.log10(self.calibrated_error) if self.calibrated_error > 0 else math.inf


def dequantize(
    values: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
) -> tuple[torch.Tensor, str] | str:
    """The weight vLLM multiplies with, E4M3 ``values`` [N, K] times ``scale`` broadcast by
    its layout, and the layout's name; or why the layout is not one check 6 knows.

    ``block`` is the [rows, columns] block the draft's config declares (None: none)."""
    rows, cols = values.shape
    values = values.float()
    scale = scale.float()
    shape = tuple(scale.shape)
    if scale.numel() == 1:
        return values * scale.flatten()[0], "per-tensor"
    if shape in ((rows,), (rows, 1)):
        return values * scale.reshape(rows, 1), "per-channel"
    if len(shape) == 2 and block is not None:
        bn, bk = block
        expected = (math.ceil(rows / bn), math.ceil(cols / bk))
        if shape == expected:
            full = scale.repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]
            return values * full, f"block {bn}x{bk}"
        return (
            f"has shape {list(shape)}; the config's {bn}x{bk} blocks of a [{rows}, {cols}] "
            f"weight need {list(expected)}"
        )
    known = f"[1], [{rows}] or [{rows}, 1]"
    if len(shape) == 2:
        known += ", or blocks that the config declares (none declared)"
    return f"has shape {list(shape)}: not a layout check 6 knows ({known})"


def calibrated_fp8(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded through E4M3 with its calibrated per-tensor scale, amax / 448."""
    weight = weight.float()
    amax = float(weight.abs().max())
    if amax == 0:
        return weight.clone()
    scale = amax / FP8_E4M3_MAX
    return (weight / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(
        torch.float8_e4m3fn
    ).float() * scale


def weight_effect(
    dequantized: torch.Tensor, baseline: torch.Tensor, calibrated: torch.Tensor, layout: str
) -> WeightEffect:
    """Relative RMS error of the draft's weight and of a calibrated rounding, both against the
    BF16 baseline's weight (an all-zero baseline: the absolute error)."""
    base = baseline.float()
    norm = float(base.norm()) or 1.0
    return WeightEffect(
        layout=layout,
        error=float((dequantized.float() - base).norm()) / norm,
        calibrated_error=float((calibrated.float() - base).norm()) / norm,
    )


def mx_block_check(rows: int, cols: int, shape: tuple[int, ...]) -> str | None:
    """Why an MX scale of ``shape`` cannot be a [rows, cols] weight's (None: it can)."""
    expected = (rows, cols // MX_BLOCK)
    if cols % MX_BLOCK or shape != expected:
        return f"has shape {list(shape)}, expected {list(expected)} (one E8M0 exponent per 32)"
    return None
