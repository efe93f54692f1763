"""Running vLLM for the tool: engine configuration (``config``), engine child processes
(``process``) and ``vllm serve`` servers (``server``). Shared by validate, tune and capture,
so all three start vLLM the same way.
Nothing here imports vLLM.
"""
