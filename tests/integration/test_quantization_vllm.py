"""Each quantization method's rules (eaglequant.quantization) held to the installed vLLM's own
matching functions, config classes and block validation: the tests in
``vllm_quantization_rules.py``, run in a child pytest session, since importing vLLM's
ModelOpt, fp8 and compressed-tensors configs loads vLLM's kernel library."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import PYTHON, run_child

RULES = Path(__file__).with_name("vllm_quantization_rules.py")


def test_every_methods_rules_are_vllms() -> None:
    code = (
        "import sys, pytest\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--noconftest', {str(RULES)!r}]))\n"
    )
    output = run_child([PYTHON, "-c", code])
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
