"""``python -m eaglequant.cli``: the same command line as the ``eaglequant`` script."""

from eaglequant.cli import run

run()
