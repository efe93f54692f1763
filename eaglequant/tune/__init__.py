"""``eaglequant tune``: measure speculative decoding on a real ``vllm serve`` and recommend.

``sweep`` runs the servers and ``vllm bench serve``; ``choice`` decides on the
recorded numbers only; ``report`` writes results.json, results.md and the plots.
"""
