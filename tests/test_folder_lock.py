"""folder_lock.py: one writer per folder, refused in one line; the lock path is the folder's own file."""

import os
import subprocess
import sys

import pytest

from acoustic_mlm import folder_lock as fl
from acoustic_mlm.errors import UserError

HOLDER = r"""
import sys, time
from acoustic_mlm.folder_lock import folder_lock
with folder_lock(sys.argv[1], "train prenorm_clip1"):
    print("holding", flush=True)
    time.sleep(60)
"""


def test_a_second_writer_of_a_folder_is_refused_while_the_first_holds_it(tmp_path):
    folder = tmp_path / "runs" / "prenorm_clip1"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        for what in ("train prenorm_clip1", "train other"):  # the same command or another: refused alike
            with pytest.raises(UserError) as refused:
                with fl.folder_lock(folder, what):
                    pytest.fail("entered a folder another process holds")
            message = str(refused.value)
            assert message.startswith(f"{folder}: amlm train prenorm_clip1 (pid {holder.pid} on ")
            assert "is writing this folder now" in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()
    with fl.folder_lock(folder, "train prenorm_clip1"):  # a killed holder released it
        with pytest.raises(UserError, match=f"pid {os.getpid()} on"):
            with fl.folder_lock(folder, "train again"):  # a second lock in one process is refused too
                pass
        assert [p.name for p in folder.iterdir()] == [fl.LOCK_NAME]  # the killed holder's file, now ours
    assert list(folder.iterdir()) == []  # the holder removes its lock file on its way out
    with fl.folder_lock(tmp_path / "new" / "run", "train x"):
        pass
    assert not (tmp_path / "new" / "run").exists()  # a folder it made and nothing filled is not left behind


@pytest.mark.parametrize("kind", ["symlink", "dangling_symlink", "folder", "fifo", "hard_link"])
def test_a_lock_path_that_is_not_the_folders_own_file_is_refused_and_nothing_outside_is_written(tmp_path, kind):
    folder, outside = tmp_path / "runs" / "prenorm_clip1", tmp_path / "precious.txt"
    folder.mkdir(parents=True)
    outside.write_text("keep me")
    path = folder / fl.LOCK_NAME
    {
        "symlink": lambda: path.symlink_to(outside),
        "dangling_symlink": lambda: path.symlink_to(tmp_path / "elsewhere" / "new.txt"),
        "folder": lambda: path.mkdir(),
        "fifo": lambda: os.mkfifo(path),
        "hard_link": lambda: os.link(outside, path),
    }[kind]()
    with pytest.raises(UserError) as refused:
        with fl.folder_lock(folder, "train prenorm_clip1"):
            pytest.fail("locked through a path that is not the folder's own file")
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "not the lock file amlm writes there; remove it" in message
    assert "\n" not in message
    assert outside.read_text() == "keep me" and not (tmp_path / "elsewhere").exists()
    assert os.path.lexists(path)  # left for the user to look at, never removed or followed
    assert fl.folder_busy(folder) is None


def test_the_lock_is_filelocks_with_the_holders_line(tmp_path):
    import filelock

    folder = tmp_path / "run"
    with fl.folder_lock(folder, "train x"):
        line = (folder / fl.LOCK_NAME).read_text()
        assert line == f"amlm train x (pid {os.getpid()} on {fl._host()})"
        assert fl.folder_busy(folder) == line
        with pytest.raises(filelock.Timeout):  # the library's lock, as any filelock user sees it
            filelock.FileLock(folder / fl.LOCK_NAME, timeout=0).acquire()
    assert not folder.exists() and fl.folder_busy(folder) is None
