"""eaglequant: BF16 EAGLE-3 draft -> static FP8 E4M3 draft for vLLM, with proof.

The core package is torch-free and imports nothing heavy: errors, recipes, progress,
the result contracts (``eaglequant.results``), the draft rules (``eaglequant.rules``)
and checkpoint I/O (``eaglequant.io``); the command line (``eaglequant.cli``),
rendering (``eaglequant.render``) and the Hub (``eaglequant.hub``) sit on top of it.
``eaglequant.model`` holds the torch draft module. The example pairs (the toy pair, SmolLM2 and the
drafts' trainer) are the ``eaglequant-examples`` package in ``examples/``, not part of this one. The
export pipeline lives in ``eaglequant.quantize`` (folder ``quantize/``) and the
vLLM validation in ``eaglequant.validate`` (folder ``validate/``).
"""

__version__ = "0.2.0"
