"""``embedded.StateFile``: the one reader and writer of a running process's record (nats-server.json, stack.json)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infrarsi.bus.embedded import StateFile, running_server_url, server_state


def test_a_record_is_live_while_its_process_is_and_forgotten_on_stop(tmp_path: Path) -> None:
    state = server_state(tmp_path)
    assert state.read() is None and state.live() is None and running_server_url(tmp_path) is None
    state.write(url="nats://127.0.0.1:1", pid=os.getpid(), monitor_port=2)
    assert state.live() == {"url": "nats://127.0.0.1:1", "pid": os.getpid(), "monitor_port": 2}
    assert running_server_url(tmp_path) == "nats://127.0.0.1:1"
    state.forget()
    state.forget()  # twice: nothing left to remove is no error
    assert not state.path.exists()


def test_a_killed_process_or_a_torn_record_is_not_live(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    state = StateFile(tmp_path / "stack.json")
    state.write(url="u", pid=int(gone.stdout))
    assert state.read() is not None and state.live() is None  # the record a kill left behind
    state.path.write_text('{"url": "u", "pid"')  # torn mid-write
    assert state.read() is None and state.live() is None
    state.path.write_text('{"url": "u"}')  # no pid: not a record of a process
    assert state.read() is None
