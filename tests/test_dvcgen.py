"""dvcgen.py: `amlm dvc-yaml --check` refuses a stale file; the file names the configuration relative
to its own folder and is never written outside the repository."""

import json
import subprocess
import sys

import pytest
import yaml
from helpers import copy_repo, write_sweep_config

from acoustic_mlm import config as C
from acoustic_mlm import dvcgen
from acoustic_mlm.cli import main
from acoustic_mlm.errors import UserError


@pytest.mark.slow
def test_dvc_yaml_check_refuses_a_stale_file(root, tmp_path, capsys):
    """After a change of the sweep the file must be generated again: its first stage checks it."""
    from acoustic_mlm import cli

    config, out = tmp_path / "config" / "c.yaml", tmp_path / "dvc.yaml"
    config.parent.mkdir()
    config.write_text((root / "config" / "smoke.yaml").read_text())
    check = ["dvc-yaml", "--config", str(config), "--out", str(out), "--check"]
    assert cli.main(check) == 2  # no file yet
    assert cli.main(check[:-1]) == 0 and cli.main(check) == 0
    assert out.read_text().count("config/c.yaml") > 10  # named relative to the folder of dvc.yaml
    write_sweep_config(root, config)
    capsys.readouterr()
    assert cli.main(check) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not the file generated for it" in err and "amlm dvc-yaml --config" in err
    outside = tmp_path / "elsewhere" / "dvc.yaml"
    outside.parent.mkdir()
    assert cli.main(["dvc-yaml", "--config", str(config), "--out", str(outside)]) == 2
    assert "outside" in capsys.readouterr().err and not outside.exists()


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.mkdir(), "--out names an existing folder, not a file; name a file"),
        (lambda p: (p / "dvc.yaml").mkdir(parents=True), "--out names an existing folder"),
    ],
)
@pytest.mark.parametrize("check", [False, True])
def test_dvc_yaml_out_naming_a_folder_is_one_line(root, tmp_path, capsys, make, words, check):
    out = tmp_path / "out"
    make(out)
    target = out if out.is_dir() and not (out / "dvc.yaml").exists() else out / "dvc.yaml"
    capsys.readouterr()
    code = main(
        [
            "dvc-yaml",
            "--config",
            str(root / "config" / "smoke.yaml"),
            "--out",
            str(target),
            *(["--check"] if check else []),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"amlm dvc-yaml: error: {target}: ") and words in err, err
    with pytest.raises(UserError, match="--out names an existing folder"):  # the functions refuse it as well
        (dvcgen.check if check else dvcgen.write)(
            C.load(root / "config" / "smoke.yaml"), root / "config" / "smoke.yaml", target
        )


def test_dvc_yaml_out_under_a_file_is_one_line(root, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    code = main(
        ["dvc-yaml", "--config", str(root / "config" / "smoke.yaml"), "--out", str(tmp_path / "a_file" / "dvc.yaml")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "lies under" in err and "which is a file, not a folder" in err and "\n" not in err


def _dvc(repo, *args):
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_loss_curves_plot_is_log_x_with_a_line_per_run_and_seed(root, tmp_path):
    """dvc.yaml's plot of the tidy loss_curves.csv uses .dvc/plots/loss_curves.json: codebook 0 only,
    a logarithmic step axis, colour by the run's label, one series per revision, run, seed and split;
    `dvc plots show` renders it with the table's rows."""
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    # One top-level plot overlays the arms; no stage declares a curve plot of its own (four per-arm plots before);
    # the stages' plots are images (the stability figure's PNG).
    assert dvc["plots"] == [{"results/loss_curves.csv": {"template": "loss_curves", "x": "step", "y": "loss_bits"}}]
    stage_plots = [p for st in dvc["stages"].values() for p in (st.get("do") or st).get("plots", [])]
    assert stage_plots and all(isinstance(p, str) and p.endswith(".png") for p in stage_plots), stage_plots
    assert "results/loss_curves.csv" in dvc["stages"]["aggregate"]["outs"]
    spec = json.loads((root / ".dvc" / "plots" / "loss_curves.json").read_text())
    assert spec["encoding"]["x"]["scale"] == {"type": "log"}
    assert spec["encoding"]["color"]["field"] == "label" and spec["encoding"]["detail"]["field"] == "series"
    assert {"filter": "datum.codebook == 0"} in spec["transform"]
    series = next(t for t in spec["transform"] if t.get("as") == "series")["calculate"]
    assert all(f"datum.{f}" in series for f in ("rev", "run", "seed", "split"))

    repo = copy_repo(root, tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    rows = ["run,label,seed,step,split,codebook,loss_bits"] + [
        f"{run},{run.upper()},{seed},{step},train,{cb},{9 - step / 1000 - seed / 10}"
        for run in ("a", "b")
        for seed in (1, 2)
        for step in (1, 10, 100)
        for cb in (0, 1)
    ]
    (repo / "results").mkdir(exist_ok=True)
    (repo / "results" / "loss_curves.csv").write_text("\n".join(rows) + "\n")
    proc = _dvc(repo, "plots", "show", "--json")  # every plot: the top-level one (the figures are not there)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rendered,) = json.loads(proc.stdout)["data"]["results/loss_curves.csv"]
    content = rendered["content"]
    assert content["encoding"]["x"] == {
        "field": "step",
        "type": "quantitative",
        "title": "step",
        "scale": {"type": "log"},
    }
    assert content["encoding"]["y"]["field"] == "loss_bits"
    values = content["data"]["values"]
    assert (
        len(values) == 24 and {v["run"] for v in values} == {"a", "b"} and {v["rev"] for v in values} == {"workspace"}
    )


@pytest.mark.slow
def test_dvc_repro_dry_on_a_fresh_copy_is_as_documented(root, tmp_path):
    """DVC 3.67 hashes, in a dry run, the dependencies an earlier stage would write (its run cache,
    treeverse/dvc#9021), so `dvc repro --dry` fails on a fresh clone of any pipeline of two stages;
    `dvc repro --dry --force` lists every stage and `dvc status` every stage as changed
    (docs/troubleshooting.md). If a DVC release fixes the dry run, this test says so."""
    repo = copy_repo(root, tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    stages = _stage_names(root)
    forced = _dvc(repo, "repro", "--dry", "--force")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert all(f"Running stage '{s}'" in forced.stdout for s in stages), forced.stdout[-2000:]
    plain = _dvc(repo, "repro", "--dry")
    assert plain.returncode == 255 and "No such file or directory" in plain.stderr, plain.stderr[-2000:]
    assert "treeverse/dvc/issues/9021" in (root / "docs" / "troubleshooting.md").read_text()


def _stage_names(root):
    """The stage names of the committed dvc.yaml, a foreach stage once per arm of config/config.yaml."""
    doc = yaml.safe_load((root / "dvc.yaml").read_text())
    runs = yaml.safe_load((root / "config" / "config.yaml").read_text())["runs"]
    names = []
    for name, stage in doc["stages"].items():
        names += [f"{name}@{run}" for run in runs] if "foreach" in stage else [name]
    return names


def _headline_inputs(folder, finals=None, verdicts=None):
    finals = finals if finals is not None else {"clip10": 5.61, "clip1": 5.93, "deepnorm": 6.02, "attn_relax": 5.9}
    verdicts = verdicts if verdicts is not None else dict(zip("abcdef", ["reproduced"] * 4 + ["inconclusive"] * 2))
    (folder / "final_losses.json").write_text(json.dumps(finals))
    (folder / "claims.json").write_text(json.dumps({"claims": [], "verdicts": verdicts, "split": "train"}))
    return folder / "final_losses.json", folder / "claims.json"


def test_the_metrics_file_is_flat_final_losses_and_verdicts(root, tmp_path, capsys):
    finals, claims = _headline_inputs(tmp_path)
    out = tmp_path / "results" / "metrics.json"
    args = ["metrics", "--config", str(root / "config" / "smoke.yaml"), "--finals", str(finals)]
    assert main([*args, "--claims", str(claims), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got == {
        "clip10": 5.61,
        "clip1": 5.93,
        "deepnorm": 6.02,
        "attn_relax": 5.9,
        **{f"claim_{c}": "reproduced" for c in "abcd"},
        "claim_e": "inconclusive",
        "claim_f": "inconclusive",
    }
    assert all(not isinstance(v, (dict, list)) for v in got.values())  # flat: one dvc exp show column per key
    # A damaged input is one line naming the file and the stage to rerun; nothing is written.
    out.unlink()
    (tmp_path / "claims.json").write_text(json.dumps({"verdicts": ["a"]}))
    capsys.readouterr()
    assert main([*args, "--claims", str(claims), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{claims}: 'verdicts' is" in err and "claims" in err and not out.exists()
    _headline_inputs(tmp_path, finals={"clip10": "5.6"})
    assert main([*args, "--claims", str(claims), "--out", str(out)]) == 2
    assert "'clip10' is '5.6', not a loss in bits; rerun the aggregate stage" in capsys.readouterr().err


def test_dvc_exp_show_reads_the_final_losses_in_its_first_columns(root, tmp_path):
    """DVC's convention: one small flat metrics file, read first by `dvc exp show`: with no
    filter, the arms' final losses and the claims' verdicts are its first columns after the experiment's name
    and date, at most 15 in all; summary.json and claims.json are plain outputs."""
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    metrics = [m for st in dvc["stages"].values() for m in (st.get("do") or st).get("metrics", [])]
    assert metrics == ["results/metrics.json"]
    repo = copy_repo(root, tmp_path / "repo")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    finals, claims = _headline_inputs(tmp_path)
    (repo / "results").mkdir(exist_ok=True)
    assert main(["metrics", "--config", str(root / "config" / "config.yaml"), "--finals", str(finals),
                 "--claims", str(claims), "--out", str(repo / "results" / "metrics.json")]) == 0  # fmt: skip
    proc = _dvc(repo, "exp", "show", "--no-pager", "--csv")
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = proc.stdout.splitlines()[0].split(",")
    assert header[:2] == ["Experiment", "rev"] or header[0] == "Experiment", header[:5]
    shown = [c for c in header if c.startswith("claim_") or c in ("clip10", "clip1", "deepnorm", "attn_relax")]
    assert shown == sorted(json.loads((repo / "results" / "metrics.json").read_text()))
    last = max(header.index(c) for c in shown)
    assert last < 15 and len(shown) == 10, header[:20]
    row = proc.stdout.splitlines()[1].split(",")
    assert row[header.index("clip10")] == "5.61"
