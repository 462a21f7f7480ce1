"""One writer per state directory (``lac.common.statelock``): a second holder is refused with the first's
role and pid, and the lock goes with its process, however that process ends."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lac.common.statelock import LOCK_NAME, StateDirLock, StateDirLocked


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    state = tmp_path / "state"
    first = StateDirLock(state, "curator")
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    with pytest.raises(StateDirLocked, match=rf"{state} is in use by curator \(pid {os.getpid()}\)"):
        StateDirLock(state, "lac curator restore")  # another open file: refused in this process too
    first.release()
    first.release()  # again: nothing
    with StateDirLock(state, "shuffler"):
        assert (state / LOCK_NAME).read_text() == f"{os.getpid()} shuffler\n"
    StateDirLock(state, "curator").release()


def test_the_lock_goes_with_a_killed_holder(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lac.common.statelock import StateDirLock; "
            "lock = StateDirLock(sys.argv[1], 'curator'); print('held', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(StateDirLocked, match=rf"in use by curator \(pid {holder.pid}\)"):
            StateDirLock(tmp_path, "curator")
    finally:
        holder.kill()  # SIGKILL: no shutdown code runs
        holder.wait()
        holder.stdout.close()
    StateDirLock(tmp_path, "curator").release()  # the lock file is still there, the lock is not


def test_a_lock_taken_by_a_dropped_object_is_released(tmp_path):
    StateDirLock(tmp_path, "shuffler")  # e.g. a server whose construction failed after taking it
    StateDirLock(tmp_path, "shuffler").release()
