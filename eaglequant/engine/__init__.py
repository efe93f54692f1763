"""Running vLLM for the tool: engine configuration (``config``), engine child processes
(``process``; each child's one entry point, ``child.EngineChild``; what it is asked,
``child_request``) and ``vllm serve`` servers (``server``). Shared by validate, tune and capture,
so all three start vLLM the same way.
Nothing here imports vLLM.
"""
