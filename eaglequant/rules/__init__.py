"""Draft rules: what vLLM requires of an EAGLE-3 draft (its tensors and dimensions,
each linear's fate under its quantization, its vocabulary maps, its fit to a target,
the speculative config vLLM serves it with), and the two commands that apply them to a
folder: ``inspect`` (``inspection``) and ``fix-config`` (``fix_config``). Torch-free."""
