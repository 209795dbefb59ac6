"""``harness launch``: N local workers with TF_CONFIG, prefixed output, the first failure's status, no orphans.

The workers here are small Python programs (no TensorFlow): what is tested is the launcher.
"""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch import INTERRUPT_STATUS, TIMEOUT_STATUS, launch


def _worker(body: str) -> list[str]:
    """A worker program: ``index`` and ``workers`` are set, ``spawn_sleeper(path)`` starts a grandchild."""
    prelude = textwrap.dedent("""
        import json, os, subprocess, sys, time
        index = int(os.environ["HARNESS_WORKER_INDEX"])
        workers = int(os.environ["HARNESS_WORKERS"])
        def spawn_sleeper(path):
            child = subprocess.Popen(["sleep", "300"])
            with open(path, "w") as f:
                f.write(str(child.pid))
    """)
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _pids(folder: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(folder.glob("*.pid"))]


def _wait_gone(pids, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_each_worker_gets_its_own_tf_config_and_prefixed_output():
    out, err = io.StringIO(), io.StringIO()
    result = launch(_worker("print(os.environ['TF_CONFIG']); print('second line', index)"), 3, out=out, err=err)
    assert result.status == 0 and result.reason == "done" and result.statuses == [0, 0, 0]
    lines = out.getvalue().splitlines()
    assert sorted(line.split("] ")[0] for line in lines) == ["[worker 0"] * 2 + ["[worker 1"] * 2 + ["[worker 2"] * 2
    configs = {}
    for line in lines:
        prefix, _, text = line.partition("] ")
        if text.startswith("{"):
            configs[int(prefix.split()[1])] = json.loads(text)
    assert [configs[i]["task"] for i in range(3)] == [{"type": "worker", "index": i} for i in range(3)]
    addresses = configs[0]["cluster"]["worker"]
    assert all(c["cluster"]["worker"] == addresses for c in configs.values())
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert result.addresses == addresses
    assert err.getvalue() == ""  # a clean launch says nothing of its own


def test_the_first_failure_ends_the_launch_with_its_status_and_stops_the_others(tmp_path):
    body = f"""
        spawn_sleeper("{tmp_path}/grandchild-" + str(index) + ".pid")
        with open("{tmp_path}/worker-" + str(index) + ".pid", "w") as f:
            f.write(str(os.getpid()))
        if index == 1:
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(300)
    """
    err = io.StringIO()
    start = time.monotonic()
    result = launch(_worker(body), 3, out=io.StringIO(), err=err, grace_s=2.0)
    assert time.monotonic() - start < 30  # not the 300 s the others would sleep
    assert (result.status, result.reason, result.first_failure) == (3, "failed", 1)
    assert result.statuses[1] == 3 and result.statuses[0] is None and result.statuses[2] is None
    assert err.getvalue() == "harness launch: worker 1 exited with status 3 first; stopped worker(s) 0, 2\n"
    pids = _pids(tmp_path)
    assert len(pids) == 6  # 3 workers, 3 grandchildren
    assert _wait_gone(pids) == []


def test_a_worker_killed_by_a_signal_gives_128_plus_the_signal():
    body = """
        if index == 0:
            os.kill(os.getpid(), 9)
        time.sleep(300)
    """
    err = io.StringIO()
    result = launch(_worker(body), 2, out=io.StringIO(), err=err, grace_s=1.0)
    assert (result.status, result.first_failure) == (128 + 9, 0)
    assert "worker 0 was killed by SIGKILL (status 137) first; stopped worker(s) 1" in err.getvalue()


def test_a_timeout_stops_every_worker_with_status_124(tmp_path):
    body = f"""
        spawn_sleeper("{tmp_path}/grandchild-" + str(index) + ".pid")
        time.sleep(300)
    """
    err = io.StringIO()
    result = launch(_worker(body), 2, out=io.StringIO(), err=err, timeout_s=1.0, grace_s=1.0)
    assert (result.status, result.reason) == (TIMEOUT_STATUS, "timeout")
    assert result.statuses == [None, None]
    assert err.getvalue().startswith("harness launch: timed out after ")
    assert _wait_gone(_pids(tmp_path)) == []


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    body = """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        if index == 1:
            time.sleep(0.3)
            sys.exit(2)
        time.sleep(300)
    """
    start = time.monotonic()
    result = launch(_worker(body), 2, out=io.StringIO(), err=io.StringIO(), grace_s=1.0)
    assert result.status == 2
    assert time.monotonic() - start < 20


def test_sigterm_to_the_cli_stops_the_workers_and_a_killed_launcher_takes_its_workers_along(tmp_path):
    body = f"""
        with open("{tmp_path}/worker-" + str(index) + ".pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
    """
    code = f"import sys; from harness.cli import main; sys.exit(main(['launch', '--workers', '2', '--grace', '1', " \
           f"'--', *{_worker(body)!r}]))"
    for sig, status in ((signal.SIGTERM, INTERRUPT_STATUS), (signal.SIGKILL, -signal.SIGKILL)):
        for stale in tmp_path.glob("*.pid"):
            stale.unlink()
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # both pid files written in full
        workers = _pids(tmp_path)
        assert len(workers) == 2 and all(_alive(p) for p in workers)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == status, stderr
        if sig == signal.SIGTERM:
            assert "harness launch: interrupted; stopped worker(s) 0, 1" in stderr
        assert _wait_gone(workers) == [], f"{signal.Signals(sig).name}: workers {workers} outlived the launcher"


@pytest.mark.parametrize("command, workers, message", [
    ([], 2, "harness launch needs a command to run; got none (put it after --)"),
    (["true"], 0, "workers must be an int >= 1; got 0"),
    (["true"], True, "workers must be an int >= 1; got True"),
])
def test_bad_arguments_are_refused_naming_the_value(command, workers, message):
    with pytest.raises(ValueError) as err:
        launch(command, workers)
    assert str(err.value) == message


def test_the_cli_exits_with_the_first_failure_and_says_so_in_one_line(capsys):
    status = main(["launch", "--workers", "2", "--", *_worker("sys.exit(5 if index == 1 else 0)")])
    assert status == 5
    assert "harness launch: worker 1 exited with status 5 first" in capsys.readouterr().err
    assert main(["launch", "--workers", "0", "--", "true"]) == 2
    assert "harness launch: error: workers must be an int >= 1; got 0" in capsys.readouterr().err


def test_a_missing_program_is_an_error_and_leaves_nothing_running():
    with pytest.raises(FileNotFoundError):
        launch(["/no/such/program"], 2, out=io.StringIO(), err=io.StringIO())


def test_worker_env_reaches_each_worker():
    out = io.StringIO()
    result = launch(_worker("print(os.environ['MY_DEVICES'])"), 2, out=out, err=io.StringIO(),
                    worker_env=lambda i: {"MY_DEVICES": f"{i + 1} devices"})
    assert result.status == 0
    assert sorted(out.getvalue().splitlines()) == ["[worker 0] 1 devices", "[worker 1] 2 devices"]
    assert os.environ.get("MY_DEVICES") is None


def test_devices_per_worker_reach_each_worker_and_bad_counts_are_named(capsys):
    out = io.StringIO()
    result = launch(_worker("print(os.environ['HARNESS_WORKER_DEVICES'])"), 2, out=out, err=io.StringIO(),
                    devices_per_worker=[1, 2])
    assert result.status == 0
    assert sorted(out.getvalue().splitlines()) == ["[worker 0] 1", "[worker 1] 2"]
    out = io.StringIO()
    assert launch(_worker("print(os.environ['HARNESS_WORKER_DEVICES'])"), 2, out=out, err=io.StringIO(),
                  devices_per_worker=[3]).status == 0
    assert sorted(out.getvalue().splitlines()) == ["[worker 0] 3", "[worker 1] 3"]
    with pytest.raises(ValueError, match=r"one device count for every worker or one per worker \(3\); got \[1, 2\]"):
        launch(["true"], 3, devices_per_worker=[1, 2])
    with pytest.raises(ValueError, match=r"device count must be an int >= 1; got 0 in \[1, 0\]"):
        launch(["true"], 2, devices_per_worker=[1, 0])
    assert main(["launch", "--workers", "2", "--devices-per-worker", "1", "2", "3", "--", "true"]) == 2
    assert "one per worker (2); got [1, 2, 3]" in capsys.readouterr().err
