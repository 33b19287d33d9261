"""A multi-node job's output tail keeps the end of every node's log, not only the last node's."""

from __future__ import annotations

from pathlib import Path

from infrarsi.backends.local import TAIL_BYTES, tails_of


def test_the_failing_node_is_in_the_tail_when_another_node_logs_more(tmp_path: Path) -> None:
    node0, node1 = tmp_path / "node0.log", tmp_path / "node1.log"
    node0.write_text("step 1 loss 6.12\nRuntimeError: gloo connection reset on node 0\n")
    node1.write_text("".join(f"frame #{i}: c10d TCPStore broken pipe\n" for i in range(2000)))
    out = tails_of([node0, node1])
    assert len(out) <= TAIL_BYTES
    assert "--- node0.log ---" in out and "RuntimeError: gloo connection reset on node 0" in out
    assert "--- node1.log ---" in out and out.endswith("frame #1999: c10d TCPStore broken pipe\n")


def test_one_log_is_its_own_tail_and_missing_logs_are_skipped(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("x" * (2 * TAIL_BYTES) + "the end\n")
    assert tails_of([log]).endswith("the end\n") and len(tails_of([log])) == TAIL_BYTES
    assert tails_of([tmp_path / "gone.log", log]).startswith("--- job.log ---")
    assert tails_of([]) == ""
