"""The input range each decoder-layer linear sees when the draft runs unrolled (torch).

Export measures nothing with it (Quark observes its own ranges); validate's
scale plausibility and the tests compare written scales against it.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from eaglequant.model.eagle3 import Eagle3Draft


def input_amax(
    model: Eagle3Draft,
    batches: list[dict[str, torch.Tensor]],
    steps: int,
    output_amax: dict[str, float] | None = None,
) -> dict[str, float]:
    """Largest |input| each decoder-layer linear sees over ``steps`` unrolled steps (and, into
    ``output_amax`` when given, the largest |output| it gives)."""
    amax: dict[str, float] = {}

    def hook(name: str):  # type: ignore[no-untyped-def]
        def record(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            if output_amax is not None:
                output_amax[name] = max(output_amax.get(name, 0.0), float(out.abs().max()))

        return record

    linears = model.dims.linears
    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in linears]
    try:
        with torch.no_grad():
            for batch in tqdm(batches, desc="calibration ranges", unit="batch", disable=None):
                model.unroll(
                    batch["aux_hidden"],
                    batch["next_ids"],
                    steps,
                    keep_logits=False,
                    score_last=False,
                )
    finally:
        for handle in handles:
            handle.remove()
    return amax
