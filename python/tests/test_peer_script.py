"""The PyTorch side of `report --loop`: `benches/pytorch_peer.py --serve`.

The report sends one JSON request a line and reads one JSON answer a line;
these tests hold the script to that protocol, so a change to it fails here
rather than in the middle of a benchmark run.
"""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benches" / "pytorch_peer.py"


def ask(requests):
    """Every answer of one `--serve` process to `requests`, after its header."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--serve", "--threads", "1"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    header, *answers = [json.loads(line) for line in done.stdout.splitlines()]
    return header, answers


def request(op, workload="tiny"):
    return {"workload": workload, "op": op, "warmup_s": 0.0, "budget_s": 0.01}


def test_every_op_is_timed_and_the_header_names_torch():
    ops = [
        "gather",
        "forward",
        "bag_sum",
        "bag_mean",
        "sparse_step",
        "bag_sum_f16",
        "bag_sum_bf16",
        "bag_sum_int8",
        "bag_sum_int4",
    ]
    header, answers = ask([request(op) for op in ops])
    assert header["threads"] == 1
    assert header["torch"] and header["capability"]
    assert len(answers) == len(ops)
    for op, answer in zip(ops, answers):
        assert "error" not in answer, (op, answer)
        assert answer["ms"] > 0, (op, answer)
        assert answer["reps"] >= 5, (op, answer)


def test_a_bad_request_is_answered_with_an_error_and_the_next_one_still_works():
    _, answers = ask([request("no_such_op"), request("gather", workload="nope"), request("gather")])
    assert "no_such_op" in answers[0]["error"]
    assert "nope" in answers[1]["error"]
    assert answers[2]["ms"] > 0
