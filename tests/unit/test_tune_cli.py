"""tune --baseline's option errors: one line, exit 2, before any server or vLLM probe."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from tests.conftest import TOY, edit_config

BASE = ["tune", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]


def _error(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    return result.output.splitlines()[-1]


def test_keep_servers_needs_a_baseline() -> None:
    assert _error([*BASE, "--keep-servers"]) == (
        "error: --keep-servers applies to --baseline; add --baseline or drop it"
    )


def test_a_missing_baseline_is_named() -> None:
    assert _error([*BASE, "--baseline", "/no/such/draft"]) == (
        "error: /no/such/draft: no such folder; pass the model folder path"
    )


def test_a_quark_draft_is_refused_in_float32(tmp_path: Path) -> None:
    fp8 = shutil.copytree(TOY / "draft", tmp_path / "fp8")
    edit_config(fp8, quantization_config={"quant_method": "quark", "export": {}})
    args = ["tune", "--target", str(TOY / "target"), "--draft", str(fp8)]
    args += ["--baseline", str(TOY / "draft"), "--engine-arg", "dtype=float32"]
    assert _error(args) == (
        f"error: {fp8}: a Quark-quantized draft runs in the target's dtype, and vLLM's quark "
        "method takes bfloat16 or float16, not float32; drop dtype=float32"
    )


def test_a_schedule_does_not_go_with_a_baseline() -> None:
    args = [*BASE, "--baseline", str(TOY / "draft"), "--schedule", "[[1, 4, 2]]"]
    assert _error(args) == (
        "error: a baseline comparison measures single ks; drop the schedule or the baseline"
    )


def test_the_dataset_goes_to_vllm_bench_serve_as_its_own_options(tmp_path: Path) -> None:
    from eaglequant.tune.bench import acceptance_workload, bench_command
    from eaglequant.tune.request import TuneRequest

    share = tmp_path / "sharegpt.json"
    share.write_text('[{"conversations": [{"from": "human", "value": "hi"}, {"value": "yo"}]}]')
    common = {"target": TOY / "target", "draft": TOY / "draft", "osl": 32}
    flags = {
        name: bench_command(TuneRequest(**common, **extra), 8000, 4, tmp_path / "r.json")
        for name, extra in [
            ("random", {}),
            ("custom", {"prompts": share}),
            ("sharegpt", {"prompts": share, "dataset": "sharegpt"}),
        ]
    }
    assert flags["random"][-7:] == [
        "--dataset-name", "random", "--random-input-len", "1024", "--random-output-len", "32",
        "--ignore-eos",
    ]  # fmt: skip
    assert flags["custom"][-7:-3] == ["--dataset-name", "custom", "--dataset-path", str(share)]
    assert flags["sharegpt"][-6:] == [
        "--dataset-name", "sharegpt", "--dataset-path", str(share), "--sharegpt-output-len", "32",
    ]  # fmt: skip
    assert "--max-concurrency" in flags["random"] and "--num-warmups" in flags["random"]
    assert flags["custom"][-1] == "--skip-chat-template" and "--ignore-eos" not in flags["custom"]
    # validate's workload: the chat template (vLLM's bench applies it) and EOS ignored
    as_validate = TuneRequest(**common, prompts=share, chat_template=True, ignore_eos=True)
    served = bench_command(as_validate, 8000, 1, tmp_path / "r.json")
    assert "--skip-chat-template" not in served and served[-1] == "--ignore-eos"
    workload = acceptance_workload(as_validate, 3, 1)
    assert (workload.chat_template, workload.ignore_eos, workload.max_tokens) == (True, True, 32)
    assert _error([*BASE, "--chat-template"]) == (
        "error: --chat-template applies to --prompts sent as the custom dataset"
    )
    assert _error([*BASE, "--dataset", "sharegpt"]) == (
        "error: the sharegpt dataset reads a file; pass the prompts"
    )


def test_predict_needs_a_sweep_over_two_concurrencies() -> None:
    assert _error([*BASE, "--predict", "--baseline", str(TOY / "draft"), "--keep-servers"]) == (
        "error: --predict serves each configuration once, one at a time; drop --keep-servers"
    )
    assert _error([*BASE, "--predict", "--concurrency", "4"]) == (
        "error: --predict fits the target's step time over concurrencies: give 2 or more, "
        "e.g. --concurrency 1,8"
    )


def test_the_warm_up_visits_every_concurrency_with_prompts_of_their_own() -> None:
    """Each concurrency of the grid in turn, smallest first, that many requests in flight at
    once, every prompt ISL tokens and sharing no first token with another."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from eaglequant.tune.bench import warm_up
    from eaglequant.tune.request import TuneRequest

    lock = threading.Lock()
    seen: list[tuple[list[int], int]] = []  # (prompt, max_tokens) in order of arrival
    four_at_once = threading.Barrier(4, timeout=10)  # broken unless 4 are in flight together

    class Completions(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                seen.append((body["prompt"], body["max_tokens"]))
                first = len(seen) == 1
            try:
                if not first:  # the first, concurrency 1, is answered alone
                    four_at_once.wait()
                self.send_response(200)
            except threading.BrokenBarrierError:
                self.send_response(500)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    request = TuneRequest(
        target=TOY / "target", draft=TOY / "draft", concurrencies=(4, 1), isl=12, osl=7
    )
    try:
        warm_up(request, f"http://127.0.0.1:{server.server_address[1]}", timeout=30)
    finally:
        server.shutdown()
    assert len(seen) == 5
    prompts = [p for p, _ in seen]
    assert all(len(p) == 12 for p in prompts) and {t for _, t in seen} == {7}
    assert len({p[0] for p in prompts}) == 5
