"""The router's pure parts (no Ray): the split table, the metric gate's decision, the status line,
and the rollout CLI's argument errors (refused before any cluster is contacted)."""

from pathlib import Path

import pytest

from rayline.serve.router import RoutingTable, evaluate_gate
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]


def test_table_weights_must_sum_to_100():
    assert RoutingTable({"weights": {"1": 90, "2": 10}, "champion": "1", "canary": "2"}).weights == {"1": 90, "2": 10}
    with pytest.raises(ValueError, match="sum to 100"):
        RoutingTable({"weights": {"1": 90, "2": 20}})
    with pytest.raises(ValueError, match=">= 0"):
        RoutingTable({"weights": {"1": 110, "2": -10}})


def test_a_tripped_canary_gives_its_share_to_the_champion_only_for_its_own_rollout():
    table = RoutingTable({"weights": {"1": 70, "2": 30}, "champion": "1", "canary": "2", "rollout": "r1"})
    assert table.effective(None) == {"1": 70, "2": 30}
    assert table.effective({"rollout": "r1", "version": "2"}) == {"1": 100}
    assert table.effective({"rollout": "an-earlier-one", "version": "2"}) == {"1": 70, "2": 30}


def test_gate_waits_for_min_requests_then_names_the_limit_with_numbers():
    gate = {"max_error_rate": 0.02, "max_p99_ms": 50, "min_requests": 100}
    assert evaluate_gate(gate, 99, 99, [500.0] * 99) is None  # not enough requests yet
    assert evaluate_gate(gate, 120, 37, [1.0] * 120) == (
        "max_error_rate", "error rate 0.308 > max_error_rate 0.02 over 120 requests")
    assert evaluate_gate(gate, 100, 2, [1.0] * 100) is None  # 0.02 is not above 0.02
    slow = [10.0] * 98 + [80.0, 90.0]
    assert evaluate_gate(gate, 100, 0, slow) == ("max_p99_ms", "p99 90.0 ms > max_p99_ms 50 over 100 requests")
    assert evaluate_gate(gate, 100, 0, [10.0] * 99 + [900.0]) == (
        "max_p99_ms", "p99 900.0 ms > max_p99_ms 50 over 100 requests")
    assert evaluate_gate({"max_p99_ms": 50, "min_requests": 10}, 200, 0, [10.0] * 197 + [900.0] * 3) == (
        "max_p99_ms", "p99 900.0 ms > max_p99_ms 50 over 200 requests")
    assert evaluate_gate({"max_error_rate": 0.5, "min_requests": 1}, 10, 1, []) is None


def test_status_line_says_split_gate_and_rollback():
    from rayline.cli.serve import rollout_line

    assert rollout_line("digits", {"weights": {"1": 90, "2": 10}, "champion": "1", "canary": "2",
                                    "gate": {"max_error_rate": 0.02, "max_p99_ms": None, "min_requests": 100}}) == (
        "digits: version 1 champion 90%, version 2 canary 10%; gate max_error_rate 0.02, min_requests 100")
    gone = {"version": "2", "limit": "max_p99_ms", "detail": "p99 80.0 ms > max_p99_ms 50 over 100 requests",
            "at": "2026-11-22T16:00:00Z"}
    assert rollout_line("digits", {"weights": {"1": 100}, "champion": "1", "canary": None, "rolled_back": gone}) == (
        "digits: version 1 champion 100%; canary version 2 rolled back automatically at 2026-11-22T16:00:00Z: "
        "max_p99_ms (p99 80.0 ms > max_p99_ms 50 over 100 requests)")


@pytest.mark.parametrize("args, message", [
    (["--canary", "0"], "--canary: percent of traffic for the canary outside 1..99 (got 0; allowed: 1 to 99)"),
    (["--canary", "100"], "--canary: percent of traffic for the canary outside 1..99 (got 100; allowed: 1 to 99)"),
    (["--max-p99-ms", "50"], "--max-p99-ms: only with --canary (got --max-p99-ms without --canary; allowed: "
                             "--canary PERCENT --max-p99-ms)"),
    (["--canary", "10", "--max-error-rate", "2"], "--max-error-rate: Input should be less than or equal to 1 (got 2.0)"),
    (["--canary", "10", "--min-requests", "5"], "--min-requests: only with --max-error-rate or --max-p99-ms "
                                                "(got --min-requests 5)"),
])
def test_deploy_arguments_are_checked_before_connecting(args, message):
    proc = rayline_in_process("serve", "deploy", "digits", "--version", "1", *args, "--address", "127.0.0.1:1", cwd=ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: " + message
