"""Capturing a target's auxiliary hidden states with vLLM (its parallelism) or transformers.

``run`` (what to capture, with which engine), ``sequences`` (text to token ids),
``store`` (the capture folder), ``hf_engine`` / ``vllm_engine`` + ``vllm_child``
(the engines), ``cpu_connector`` (vLLM's hidden-states connector on CPU).
"""
