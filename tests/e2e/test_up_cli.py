"""The ``infrarsi`` command line itself: the verb table, lazy imports, and errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from infrarsi import cli
from support.owned import owned_event

INFRARSI = str(Path(sys.executable).parent / "infrarsi")


def test_help_lists_every_verb_without_importing_commands() -> None:
    code = (
        "import sys; from infrarsi import cli\n"
        "parser, _ = cli.build_parser()\n"
        "text = parser.format_help()\n"
        "assert not [m for m in sys.modules if m.startswith('infrarsi.commands.')], 'help imported a command'\n"
        "assert 'nats' not in sys.modules and 'torch' not in sys.modules\n"
        "print(text)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for verb in cli.VERBS:
        assert f"    {verb.name} " in out


def test_every_existing_command_module_has_its_entry_points() -> None:
    for verb in cli.VERBS:
        try:
            module = cli.load_verb(verb)
        except cli.VerbUnavailable:
            continue
        assert callable(getattr(module, verb.add_arguments)), verb.name
        assert callable(getattr(module, verb.run)), verb.name


def test_missing_module_means_unavailable_but_a_missing_dependency_is_a_bug(tmp_path, monkeypatch, capsys) -> None:
    ghost = cli.Verb("ghost", "no_such_command_module", "not built")
    with pytest.raises(cli.VerbUnavailable):
        cli.load_verb(ghost)
    broken = tmp_path / "infrarsi_broken_cmd.py"
    broken.write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli.Verb, "module_path", property(lambda self: self.module))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_anywhere"):
        cli.load_verb(cli.Verb("broken", "infrarsi_broken_cmd", "imports a missing package"))

    monkeypatch.setattr(cli, "VERBS", (*cli.VERBS, ghost))
    monkeypatch.setattr(cli, "VERBS_BY_NAME", {**cli.VERBS_BY_NAME, "ghost": ghost})
    assert cli.main(["ghost"]) == 2
    assert capsys.readouterr().err.strip() == "error: 'ghost' is not available in this build"


def test_unreachable_server_is_one_line_and_exit_2(tmp_path) -> None:
    result = subprocess.run(
        [INFRARSI, "--data-dir", str(tmp_path), "--nats-url", "nats://127.0.0.1:1", "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot reach NATS at nats://127.0.0.1:1: ")
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_global_options_work_before_and_after_the_verb(tmp_path) -> None:
    parser, _ = cli.build_parser(load="status")
    before = parser.parse_args(["--nats-url", "nats://a:1", "--data-dir", str(tmp_path), "status", "--json"])
    after = parser.parse_args(["status", "--json", "--nats-url", "nats://a:1", "--data-dir", str(tmp_path)])
    for args in (before, after):
        assert args.nats_url == "nats://a:1" and Path(args.data_dir) == tmp_path and args.json


def test_serve_rejects_an_unknown_service(tmp_path) -> None:
    result = subprocess.run([INFRARSI, "serve", "nosuch"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "invalid choice: 'nosuch'" in result.stderr


def test_serve_runs_the_service_module() -> None:
    from infrarsi.commands import serve

    parser, _ = cli.build_parser(load="serve")
    args = parser.parse_args(["--nats-url", "nats://n:4222", "serve", "modeler"])
    assert serve.service_argv(args) == [
        sys.executable,
        "-m",
        "infrarsi_services.modeler",
        "--data-dir",
        str(args.data_dir),
        "--nats-url",
        "nats://n:4222",
    ]


@pytest.mark.integration
async def test_events_tail_filters_follows_and_stops_on_ctrl_c(nats_server, tmp_path) -> None:
    import asyncio
    import json
    import signal

    from infrarsi import events as ev
    from infrarsi.bus.client import Bus

    study, other = ev.new_id(), ev.new_id()
    bus = await Bus.connect(nats_server, service="test")
    try:
        old = [owned_event(ev.DoctorRequested(repeats=r), study_id=study) for r in (1, 2, 3)]
        await bus.publish_many([*old, owned_event(ev.DoctorRequested(repeats=9), study_id=other)])
        base = [INFRARSI, "--nats-url", nats_server, "--data-dir", str(tmp_path), "events", "tail", "--study", study]

        last = subprocess.run([*base, "--last", "2"], capture_output=True, text=True, timeout=30)
        assert last.returncode == 0, last.stderr
        assert [json.loads(line)["event_id"] for line in last.stdout.splitlines()] == [e.event_id for e in old[1:]]

        follow = subprocess.Popen([*base, "--follow", "--type", "StudyFinished"], stdout=subprocess.PIPE, text=True)
        try:
            await asyncio.sleep(1.5)  # subscribed and idle: nothing of that type yet
            new = owned_event(ev.StudyFinished(reason="r", trials=1, accelerator_s=1.0), study_id=study)
            await bus.publish(new)
            line = await asyncio.wait_for(asyncio.to_thread(follow.stdout.readline), 15)
            assert ev.decode(line.encode()) == new
            follow.send_signal(signal.SIGINT)
            assert follow.wait(15) == 0
        finally:
            if follow.poll() is None:
                follow.kill()
    finally:
        await bus.close()


@pytest.mark.integration
async def test_serve_becomes_the_service_process(fresh_nats_server, tmp_path) -> None:
    import asyncio
    import signal

    from infrarsi.bus.client import Bus
    from infrarsi.runtime.stack import ping_services

    process = subprocess.Popen(
        [INFRARSI, "--nats-url", fresh_nats_server, "--data-dir", str(tmp_path), "serve", "modeler"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        for _ in range(100):
            replies = await ping_services(bus.nc, 0.2)
            if replies:
                break
            assert process.poll() is None, process.stderr.read()
        (reply,) = replies
        assert reply["service"] == "modeler"
        assert reply["pid"] == process.pid, "serve replaces itself with the service (exec), no wrapper left"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        await bus.close()
