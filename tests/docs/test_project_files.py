"""The files a lab adopting the package looks for: licence, citation, changelog with one version,
the Python floor, and the Snakemake workflow catalog's layout."""

import re
import tomllib

import yaml

import acoustic_mlm


def test_one_version_everywhere(root):
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "acoustic_mlm.__version__"}
    cff = yaml.safe_load((root / "CITATION.cff").read_text())
    assert str(cff["version"]) == acoustic_mlm.__version__
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", (root / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0][0] == acoustic_mlm.__version__
    # The citation's release date is the version's heading's (a BibTeX export takes its year from it).
    assert str(cff["date-released"]) == released[0][1]
    assert 'date-released: "' in (root / "CITATION.cff").read_text()  # quoted: a string, as CFF's schema wants


def test_the_package_index_metadata(root):
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Intended Audience :: Science/Research" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # PEP 639: the `license` expression says it
    assert len(classifiers) == len(set(classifiers)) and all(" :: " in c for c in classifiers)
    assert project["urls"]["Paper"] == "https://arxiv.org/abs/2306.00107"


def test_licence_and_citation(root):
    assert (root / "LICENSE").read_text().startswith("MIT License\n")
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    cff = yaml.safe_load((root / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT" and cff["type"] == "software"
    (mert,) = cff["references"]
    assert mert["year"] == 2024 and "ICLR 2024" in mert["collection-title"]
    assert mert["identifiers"][0]["value"] == "arXiv:2306.00107" and mert["authors"][0]["family-names"] == "Li"
    readme = (root / "README.md").read_text()
    assert "year      = {2024}" in readme and "eprint    = {2306.00107}" in readme


def test_the_python_floor_is_the_dependencies_and_ruffs(root):
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11"  # numpy>=2.4 and snakemake>=9 need 3.11
    assert pyproject["tool"]["ruff"]["target-version"] == "py311"
    assert any(d.startswith("numpy>=2.4") for d in pyproject["project"]["dependencies"])


def test_the_workflow_catalogs_layout(root):
    assert (root / "workflow" / "Snakefile").is_file() and (root / "config" / "README.md").is_file()
    assert 'include: "workflow/Snakefile"' in (root / "Snakefile").read_text()
    catalog = yaml.safe_load((root / ".snakemake-workflow-catalog.yml").read_text())
    assert catalog["usage"]["software-stack-deployment"] | {} == {
        "conda": True,
        "apptainer": False,
        "apptainer+conda": False,
        "report": True,
    }
    config_readme = (root / "config" / "README.md").read_text()
    for preset in sorted((root / "config").glob("*.yaml")):
        assert f"`{preset.name}`" in config_readme, f"config/README.md does not name {preset.name}"
