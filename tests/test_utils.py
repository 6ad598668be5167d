"""utils.py: atomic outputs (nothing half-written, nothing left behind), temporary names, hashes, progress."""

import errno
import hashlib
import io
import json
import logging
import os
import subprocess
import sys

import pytest
from helpers import stoppable_by_sigint

from acoustic_mlm import utils
from acoustic_mlm.utils import OutOfSpaceError, atomic_dir, atomic_path


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_atomic_path_renames_onto_the_final_name_and_replaces_an_old_file(tmp_path):
    final = tmp_path / "sub" / "out.csv"
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith(".out.csv.tmp-") and tmp.suffix == ".csv"
        tmp.write_text("new")
        assert not final.exists()  # nothing at the final name until the block ends
    assert final.read_text() == "new" and os.listdir(final.parent) == ["out.csv"]
    with atomic_path(final) as tmp:
        tmp.write_text("newer")
    assert final.read_text() == "newer"


def test_atomic_path_leaves_nothing_on_an_exception_and_keeps_the_old_file(tmp_path):
    final = tmp_path / "out.json"
    final.write_text("old")
    with pytest.raises(ValueError, match="half-way"):
        with atomic_path(final) as tmp:
            tmp.write_text("half")
            raise ValueError("half-way")
    assert final.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_atomic_dir_leaves_nothing_on_an_exception_and_replaces_a_folder_whole(tmp_path):
    final = tmp_path / "shard"
    with atomic_dir(final) as tmp:
        (tmp / "a.npy").write_bytes(b"a")
    with pytest.raises(KeyError):
        with atomic_dir(final) as tmp:
            (tmp / "b.npy").write_bytes(b"b")
            raise KeyError("b")
    assert os.listdir(tmp_path) == ["shard"] and os.listdir(final) == ["a.npy"]
    with atomic_dir(final) as tmp:
        (tmp / "c.npy").write_bytes(b"c")
    assert os.listdir(final) == ["c.npy"]  # the old folder's files do not linger


def test_a_full_disk_while_writing_is_one_line_naming_the_final_path(tmp_path):
    final = tmp_path / "codes.npy"
    with pytest.raises(OutOfSpaceError) as err:
        with atomic_path(final, needed=4096) as tmp:
            tmp.write_bytes(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
    msg = str(err.value)
    assert msg.startswith(f"{final}: not written: no space left on its file system")
    assert "it needs 4096 bytes" in msg and "nothing partial was kept" in msg and "\n" not in msg
    assert (err.value.path, err.value.written) == (final, 100) and os.listdir(tmp_path) == []


def test_an_error_inside_a_folder_names_the_file_under_the_final_folder(tmp_path):
    final = tmp_path / "prepared"
    with pytest.raises(OutOfSpaceError) as err:
        with atomic_dir(final) as tmp:
            with atomic_path(tmp / "shard0" / "audio.npy") as inner:
                inner.write_bytes(b"x" * 10)
                raise OSError(errno.EFBIG, "File too large")
    assert err.value.path == final / "shard0" / "audio.npy" and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "exc, no_room",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EFBIG, "File too large"), True),
        (OSError("1000 requested and 512 written"), True),  # numpy's tofile: a short write, no errno
        (RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 64 vs 0"), True),  # torch.save
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("No space left"), False),
    ],
)
def test_is_out_of_space_knows_each_way_a_write_runs_out_of_room(exc, no_room):
    assert utils.is_out_of_space(exc) is no_room


def test_file_sha256_of_known_strings_and_of_a_file_longer_than_one_block(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")  # FIPS 180-2, appendix B.1
    assert utils.file_sha256(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    (tmp_path / "empty").write_bytes(b"")
    assert utils.file_sha256(tmp_path / "empty") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    data = bytes(range(256)) * ((1 << 24) // 256) + b"tail"  # read in two 16 MB blocks
    (tmp_path / "big").write_bytes(data)
    assert utils.file_sha256(tmp_path / "big") == hashlib.sha256(data).hexdigest()


def test_write_json_sorts_keys_indents_and_ends_with_a_newline(tmp_path):
    utils.write_json(tmp_path / "a.json", {"b": 1, "a": [1, 2]})
    text = (tmp_path / "a.json").read_text()
    assert text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n' and json.loads(text) == {"a": [1, 2], "b": 1}


def test_a_benchmarks_header_names_its_script_and_arguments_then_its_fields_and_machine(monkeypatch):
    import torch

    monkeypatch.setattr(sys, "argv", ["/somewhere/else.py", "--from", "the process"])
    head = utils.benchmark_header("/work/benchmarks/cost.py", ["--json", "out.json"], config="c.yaml")
    assert head == {"command": "cost.py --json out.json", "config": "c.yaml"}
    assert utils.benchmark_header("cost.py", None)["command"] == "cost.py --from the process"
    machine = utils.benchmark_header("cost.py", [], torch.device("cpu"))["machine"]
    assert machine["device"] == "cpu" and machine["cpu_count"] == os.cpu_count() and "torch" in machine


def test_write_result_writes_the_json_only_when_asked_and_returns_the_result(tmp_path):
    result = {"rows": [1, 2], "command": "x.py"}
    assert utils.write_result(None, result) is result and list(tmp_path.iterdir()) == []
    assert utils.write_result(tmp_path / "deep" / "r.json", result) is result
    assert (tmp_path / "deep" / "r.json").read_text() == '{\n  "command": "x.py",\n  "rows": [\n    1,\n    2\n  ]\n}\n'


def test_remove_debris_takes_the_temporary_names_of_ended_processes_and_leaves_a_running_one_s(tmp_path):
    final = tmp_path / "metrics.csv"
    dead = tmp_path / f".metrics.csv.tmp-{_dead_pid()}-abc.csv"
    dead_dir = tmp_path / f".metrics.csv.tmp-{_dead_pid()}-def"
    live = tmp_path / f".metrics.csv.tmp-{os.getpid()}-ghi.csv"
    other = tmp_path / f".summary.json.tmp-{_dead_pid()}-jkl.json"  # another output's: not ours to remove
    for p in (dead, live, other):
        p.write_text("x")
    dead_dir.mkdir()
    (dead_dir / "inside").write_text("x")
    assert sorted(utils.remove_debris(final)) == sorted([dead, dead_dir])
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name])


def test_messages_name_the_final_path_not_the_temporary_one(tmp_path):
    final = tmp_path / "loss_curves.csv"
    with atomic_path(final) as tmp:
        assert utils.final_names(f"cannot parse {tmp} line 3") == f"cannot parse {final} line 3"
    assert utils.glob_escape("a[1]*?.csv") == "a[[]1][*][?].csv"


def test_progress_without_a_terminal_prints_plain_lines_with_the_postfix():
    out = io.StringIO()
    with utils.Progress(total=4, desc="train", unit="step", every_s=3600, stream=out) as bar:
        bar.update(1, loss=6.123456)
        bar.update(2)
        assert out.getvalue() == ""  # not yet: fewer than every_s seconds and not at the total
        bar.update(1)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("train: 4/4 (100%) ") and " step/s " in line and line.endswith("loss=6.123")


# ----------------------------------------------------------------------------- stops at any moment

STOPPED_WRITER = r"""
import os, signal, sys, tempfile
from pathlib import Path
from acoustic_mlm import cli, utils

kind, moment, final = sys.argv[1], sys.argv[2], Path(sys.argv[3])
signal.signal(signal.SIGTERM, cli._terminate)  # as amlm does: SIGTERM is SystemExit(143)
real = {"mkstemp": tempfile.mkstemp, "mkdtemp": tempfile.mkdtemp}

def created(name):
    def make(*a, **k):
        out = real[name](*a, **k)
        os.kill(os.getpid(), signal.SIGTERM if moment == "term" else signal.SIGINT)
        return out
    return make

tempfile.mkstemp, tempfile.mkdtemp = created("mkstemp"), created("mkdtemp")
writer = utils.atomic_path if kind == "file" else utils.atomic_dir
try:
    with writer(final) as tmp:
        print("inside the block", flush=True)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("kind", ["file", "dir"])
@pytest.mark.parametrize("moment, code", [("term", 143), ("int", 130)])
def test_a_stop_in_the_instant_after_a_temporary_name_is_created_leaves_nothing(tmp_path, kind, moment, code):
    final = tmp_path / "out" / "x.csv"
    final.parent.mkdir()
    final.write_text("old")
    proc = subprocess.run(
        [sys.executable, "-c", STOPPED_WRITER, kind, moment, str(final)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=stoppable_by_sigint,  # SIGINT must stop it even when the suite runs as a background job
    )
    assert proc.returncode == code, proc.stderr
    assert "inside the block" not in proc.stdout  # stopped before the body ran
    assert os.listdir(final.parent) == ["x.csv"] and final.read_text() == "old"


def test_held_signals_delivers_a_stop_after_the_block_to_the_handler_before_it():
    import signal

    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(("handler", signum)))
    try:
        with utils.held_signals():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # bytecodes run: a Python handler would have fired by now
                pass
            seen.append("end of block")
        assert seen == ["end of block", ("handler", signal.SIGINT)]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_atomic_dir_replacing_a_folder_renames_the_old_one_aside_first(tmp_path, monkeypatch):
    final = tmp_path / "raw"
    final.mkdir()
    (final / "a").write_text("old")
    renames = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda src, dst: (renames.append((src, dst)), real_rename(src, dst)))
    with atomic_dir(final) as tmp:
        (tmp / "b").write_text("new")
    assert len(renames) == 1 and renames[0][0] == final and ".raw.old-" in renames[0][1].name
    assert os.listdir(final) == ["b"] and os.listdir(tmp_path) == ["raw"]


def test_an_error_while_renaming_in_puts_the_old_folder_back(tmp_path, monkeypatch):
    final = tmp_path / "raw"
    final.mkdir()
    (final / "a").write_text("old")

    def refuse(src, dst):
        raise OSError(errno.EXDEV, "cross-device link")

    with pytest.raises(OSError, match="cross-device"):
        with atomic_dir(final) as tmp:
            (tmp / "b").write_text("new")
            monkeypatch.setattr(os, "replace", refuse)
    assert os.listdir(final) == ["a"] and os.listdir(tmp_path) == ["raw"]


def test_recover_replaced_puts_the_old_copy_back_or_removes_it(tmp_path, caplog):
    dead = _dead_pid()
    final = tmp_path / "prepared"
    aside = tmp_path / f".prepared.old-{dead}-abcd"
    aside.mkdir()
    (aside / "manifest.csv").write_text("x")
    live = tmp_path / f".prepared.old-{os.getpid()}-ef01"  # a run in progress: left alone
    live.mkdir()
    with caplog.at_level("INFO", logger="acoustic_mlm"):
        assert utils.recover_replaced(final) == final
    assert (final / "manifest.csv").read_text() == "x" and not aside.exists() and live.exists()
    assert f"{final}: put back the previous copy" in caplog.text
    aside.mkdir()  # beside a final folder: the copy a killed run was removing
    caplog.clear()
    with caplog.at_level("INFO", logger="acoustic_mlm"):
        assert utils.recover_replaced(final) is None
    assert not aside.exists() and (final / "manifest.csv").is_file()
    assert f"{final}: removed the previous copy ({aside.name})" in caplog.text


def test_fp16_max_is_float16s_largest_finite_value():
    """utils.FP16_MAX is the one home of the number: the diagnostics and the reports import it."""
    import torch

    from acoustic_mlm.report import spike_diagnostics, stability, stability_map
    from acoustic_mlm.train import diagnostics

    assert utils.FP16_MAX == float(torch.finfo(torch.float16).max) == 65504.0
    for module in (diagnostics, stability, stability_map, spike_diagnostics):
        assert module.FP16_MAX is utils.FP16_MAX


def test_atomic_group_replaces_the_files_together_and_keeps_the_folders_other_files(tmp_path):
    out = tmp_path / "out"
    names = ("a.csv", "b.json")
    with utils.atomic_group(out, names) as tmp:
        (tmp / "a.csv").write_text("1")
        (tmp / "b.json").write_text("1")
    (out / "mine.txt").write_text("kept")
    (out / "sub").mkdir()
    (out / "sub" / "x").write_text("kept too")
    stops = [(KeyboardInterrupt(), KeyboardInterrupt), (SystemExit(143), SystemExit)]
    stops.append((OSError(28, "No space left on device"), OutOfSpaceError))  # a full disk: one line naming `out`
    for stop, seen in stops:
        with pytest.raises(seen):
            with utils.atomic_group(out, names) as tmp:
                (tmp / "a.csv").write_text("2")
                raise stop  # before b.json: the folder keeps both old files
        assert (out / "a.csv").read_text() == "1" and (out / "b.json").read_text() == "1"
    with pytest.raises(RuntimeError, match="b.json not written"):  # a group missing a member is not put in place
        with utils.atomic_group(out, names) as tmp:
            (tmp / "a.csv").write_text("3")
    with utils.atomic_group(out, names) as tmp:
        (tmp / "a.csv").write_text("4")
        (tmp / "b.json").write_text("4")
    assert [(out / n).read_text() for n in names] == ["4", "4"]
    assert (out / "mine.txt").read_text() == "kept" and (out / "sub" / "x").read_text() == "kept too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old folder left


def _killed_run_folder(final, key, parts):
    """The temporary folder a hard-killed run left for `final`: its inputs record and finished parts."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    tmp = final.parent / f".{final.name}.tmp-{int(dead.stdout)}-x"  # a process id that is gone
    tmp.mkdir()
    (tmp / utils.RESUME).write_text(json.dumps(key))
    for name in parts:
        (tmp / name).mkdir()
        (tmp / name / "done.json").write_text("{}")
    return tmp


def test_a_resumable_folder_takes_the_killed_runs_parts_made_from_the_same_inputs(tmp_path):
    final = tmp_path / "codes"
    left = _killed_run_folder(final, {"settings": 1}, ["shard-00000", "shard-00001"])
    (left / "shard-00001" / "done.json").unlink()  # killed while writing this one
    with utils.resumable_dir(final, "tokenize") as parts:
        assert parts.match({"settings": 1})
        assert parts.take("shard-00000", "done.json") and not parts.take("shard-00001", "done.json")
        (parts.tmp / "shard-00001").mkdir()
        parts.done()
    assert sorted(p.name for p in final.iterdir()) == ["shard-00000", "shard-00001"]  # no resume.json
    assert not left.exists() and not list(tmp_path.glob(".codes.tmp-*"))  # the claimed folder is gone


def test_a_resumable_folder_takes_nothing_made_from_other_inputs(tmp_path):
    final = tmp_path / "codes"
    _killed_run_folder(final, {"settings": 1}, ["shard-00000"])
    with utils.resumable_dir(final, "tokenize") as parts:
        assert not parts.match({"settings": 2})
        assert not parts.take("shard-00000", "done.json")
        assert json.loads((parts.tmp / utils.RESUME).read_text()) == {"settings": 2}  # for the next run
        parts.done()
    assert list(final.iterdir()) == []  # nothing of the other inputs' run came in
    assert not list(tmp_path.glob(".codes.tmp-*"))


def test_a_resumable_part_that_fails_its_check_is_redone_not_taken(tmp_path, caplog):
    final = tmp_path / "prepared"
    _killed_run_folder(final, {"settings": 1}, ["shard-00000", "shard-00001"])
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        with utils.resumable_dir(final, "prepare") as parts:
            assert parts.match({"settings": 1})
            cut = {"shard-00001": "its audio.npy holds 3 samples where shard.json records 9"}
            names = ["shard-00001", "shard-00000"]
            taken = [parts.take(name, "done.json", check=lambda f: cut.get(f.name)) for name in names]
            assert taken == [False, True]
            (parts.tmp / "shard-00001").mkdir()
            parts.done()
    assert "prepare shard-00001: left by the killed earlier run but its audio.npy holds 3 samples" in caplog.text


SIGTERMED_STAGE = r"""
import os, signal, sys
from pathlib import Path
from acoustic_mlm import cli, utils

signal.signal(signal.SIGTERM, cli._terminate)  # as amlm does: SIGTERM is SystemExit(143)
with utils.resumable_dir(Path(sys.argv[1]), "tokenize") as parts:
    parts.match({"settings": 1})
    (parts.tmp / "shard-00000").mkdir()
    (parts.tmp / "shard-00000" / "done.json").write_text("{}")
    os.kill(os.getpid(), signal.SIGTERM)  # a scheduler preempts the job while shard 1 is encoded
"""


def test_a_resumable_stage_stopped_by_sigterm_keeps_its_finished_parts_for_the_next_run(tmp_path):
    final = tmp_path / "codes"
    stopped = subprocess.run([sys.executable, "-c", SIGTERMED_STAGE, str(final)], capture_output=True, text=True)
    assert stopped.returncode == 143, stopped.stderr
    assert not final.exists() and len(list(tmp_path.glob(".codes.tmp-*"))) == 1  # kept, never under the final name
    with utils.resumable_dir(final, "tokenize") as parts:
        assert parts.match({"settings": 1}) and parts.take("shard-00000", "done.json")
        parts.done()
    assert [p.name for p in final.iterdir()] == ["shard-00000"]
    assert not list(tmp_path.glob(".codes.tmp-*"))
