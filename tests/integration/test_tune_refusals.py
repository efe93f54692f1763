"""tune (real vllm serve + vllm bench serve on the toy pair) and the model card."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.engine.config import EngineOptions
from eaglequant.errors import InputError
from eaglequant.tune.request import TuneRequest, check_request, engine_flags
from tests.conftest import TOY
from tests.support import servers_running


def test_max_model_len_headroom_is_checked_before_serving(tmp_path: Path) -> None:
    request = TuneRequest(
        target=TOY / "target",
        draft=TOY / "draft",
        ks=(4, 6, 8),
        isl=1024,
        osl=1024,
        engine=EngineOptions(max_model_len=2048),
    )
    with pytest.raises(
        InputError, match=r"--max-model-len 2048 is too small .* set --max-model-len 2056"
    ):
        check_request(request)
    given = TuneRequest(
        target=TOY / "target",
        draft=TOY / "draft",
        ks=(2,),
        isl=8,
        osl=8,
        engine=EngineOptions(max_model_len=300),
    )
    assert " ".join(engine_flags(given, None, check_request(given))).startswith(
        "--tensor-parallel-size 1 --max-model-len 300"
    )
    # unset: k positions of headroom past vLLM's own minimum (the CPU build drafts worse without)
    default = TuneRequest(target=TOY / "target", draft=TOY / "draft", ks=(2, 8), isl=64, osl=64)
    assert check_request(default) == 64 + 64 + 2 * 8
    passthrough = TuneRequest(
        target=TOY / "target", draft=TOY / "draft", ks=(6,), serve_args=("--max-model-len", "2304")
    )
    assert check_request(passthrough) == 2304
    result = CliRunner().invoke(
        main,
        [
            "tune",
            "--target",
            str(TOY / "target"),
            "--draft",
            str(TOY / "draft"),
            "--max-model-len",
            "100",
        ],
    )
    assert result.exit_code == 2 and "is too small" in result.output


def test_a_bad_schedule_or_repeats_is_refused_before_serving() -> None:
    base = {"target": TOY / "target", "draft": TOY / "draft", "ks": (2,), "isl": 10, "osl": 10}
    with pytest.raises(InputError, match=r"must start at batch size 1"):
        check_request(TuneRequest(**base, schedule=((2, 8, 2),)))
    with pytest.raises(InputError, match=r"at least once"):
        check_request(TuneRequest(**base, repeats=0))
    # The headroom covers a given schedule's k beyond the swept ks: 10 + 10 + 2 x 7.
    assert check_request(TuneRequest(**base, schedule=((1, 1, 0), (2, 8, 7)))) == 34
    args = ["tune", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
    result = CliRunner().invoke(main, [*args, "--schedule", "1-4:2"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "error: --schedule '1-4:2': give a JSON list of [first batch size, last, k], "
        "e.g. [[1,4,6],[5,64,3]]"
    )
    assert not servers_running()


def test_unknown_engine_arg_is_refused_before_any_server_starts() -> None:
    args = ["tune", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
    result = CliRunner().invoke(main, [*args, "--engine-arg", "gpu_memory_util=0.9"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "error: engine argument 'gpu_memory_util' is not a vLLM EngineArgs field; "
        "did you mean 'gpu_memory_utilization'?"
    )
    assert not servers_running()
