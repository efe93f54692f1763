"""Running vLLM for the tool: engine configuration (``config``) and engine child processes
(``process``). Shared by validate, tune and capture, so all three start vLLM the same way.
Nothing here imports vLLM.
"""
