"""eaglequant: BF16 EAGLE-3 draft -> static FP8 E4M3 draft for vLLM, with proof.

The core package holds what every command needs and imports nothing heavy:
errors, checkpoint reading and checking, exclusion rewriting, output writing.
The export pipeline lives in ``eaglequant.quantize`` (folder ``quantize/``) and
the vLLM validation in ``eaglequant.validate`` (folder ``validate/``).
"""

__version__ = "0.1.0"
