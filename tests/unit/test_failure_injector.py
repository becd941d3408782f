"""The failure injector (tests/support/faults.py) heals what it did: a suspended process
runs again, a filler is removed and a size-limited directory unmounted on exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.faults import FailureInjector


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, want: str) -> str:
    deadline = time.monotonic() + 10
    while (state := _state(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_suspended_process_is_resumed_on_exit(sleeper):
    with FailureInjector() as faults:
        faults.suspend(sleeper.pid)
        assert _wait_state(sleeper.pid, "T") == "T"
    assert _wait_state(sleeper.pid, "S") == "S"


def test_suspended_block_and_terminate(sleeper):
    with FailureInjector() as faults:
        with faults.suspended(sleeper.pid):
            assert _wait_state(sleeper.pid, "T") == "T"
        assert _wait_state(sleeper.pid, "S") == "S"
        faults.suspend(sleeper.pid)
        # a suspended process is resumed first, so SIGTERM ends it
        assert faults.terminate(sleeper.pid, timeout_s=10)


def test_kill_ends_a_suspended_process_and_waits_until_it_is_gone(sleeper):
    with FailureInjector() as faults:
        faults.suspend(sleeper.pid)
        assert _wait_state(sleeper.pid, "T") == "T"
        assert faults.kill(sleeper.pid, timeout_s=10)
        # gone when kill returns: nothing of it runs any more (a zombie until reaped)
        assert _state(sleeper.pid) == "Z"
    assert sleeper.wait(10) == -9


def test_a_full_size_limited_dir_is_freed_and_unmounted_on_exit(tmp_path):
    target = tmp_path / "small"
    with FailureInjector() as faults:
        faults.size_limited_dir(target, 8)  # skips where mounting is not permitted
        assert os.path.ismount(target)
        filler = faults.fill_disk(target)
        st = os.statvfs(target)
        assert st.f_bavail * st.f_frsize < 1024 * 1024
        with pytest.raises(OSError):
            with open(target / "more", "wb") as f:
                f.write(b"x" * 2 * 1024 * 1024)
        faults.free_disk(filler)
        assert not filler.exists()
        faults.fill_disk(target, leave_bytes=4 * 1024 * 1024)
    assert not os.path.ismount(target)


def test_bad_sizes_are_refused(tmp_path):
    with FailureInjector() as faults, pytest.raises(ValueError):
        faults.size_limited_dir(tmp_path / "x", 0)
