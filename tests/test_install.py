"""scripts/install.sh decides about Python and torch before installing anything (``DRY_RUN=1`` prints the plan).

* a torch the venv already imports is kept; so is the torch of ``PYTHON=...`` (also when that Python is a venv);
* without a GPU, torch comes from the PyTorch CPU index; with one, from the default index;
* an unsupported Python is refused, naming the variable, before the venv is created;
* ``make install``/``make test``/``make demo`` run the script, and ``PYTHON=`` reaches it through make;
* the Python versions in pyproject.toml are the ones the script accepts.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install.sh"


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def fakes(tmp_path):
    """Interpreters and nvidia-smi stand-ins: a Python without torch, one that claims 3.10, a GPU, no GPU."""
    gpu, nogpu = tmp_path / "gpu", tmp_path / "nogpu"
    gpu.mkdir()
    nogpu.mkdir()
    _exe(gpu / "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"')
    _exe(nogpu / "nvidia-smi",
         'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the driver" >&2; exit 9')
    return {
        "no_torch": _exe(tmp_path / "python-no-torch", f'exec "{sys.executable}" -S "$@"'),  # -S: no site-packages
        "py310": _exe(tmp_path / "python3.10", 'echo 3.10'),
        # a Python 3.11 whose torch is 1.13: answers the install's two questions as such an interpreter would
        "old_torch": _exe(tmp_path / "python-old-torch",
                          'case "$2" in *torch*) printf "1.13.1\\t/opt/old/site-packages\\n";; *) echo 3.11;; esac'),
        "gpu_path": f"{gpu}{os.pathsep}{os.environ['PATH']}",
        "nogpu_path": f"{nogpu}{os.pathsep}{os.environ['PATH']}",
        "venv": tmp_path / "venv",
    }


def _install(env, dry_run="1"):
    full = dict(os.environ, DRY_RUN=dry_run)
    for name in ("PYTHON", "VENV", "TORCH_CPU_INDEX", "TORCH_VERSION"):
        full.pop(name, None)
    full.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=300)


def _torch_plan(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[install] plan: torch: ")]
    assert len(lines) == 1, proc.stdout
    return lines[0][len("[install] plan: torch: "):]


def test_torch_already_in_the_venv_is_kept(fakes):
    import torch

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment")
    plan = _torch_plan(_install({"VENV": sys.prefix, "PATH": fakes["gpu_path"]}))  # the venv running the tests
    assert plan.startswith("keep-venv: ") and f"keep torch {torch.__version__}" in plan


def test_no_gpu_installs_the_cpu_build_from_the_cpu_index(fakes):
    plan = _torch_plan(_install({"VENV": fakes["venv"], "PYTHON": fakes["no_torch"], "PATH": fakes["nogpu_path"]}))
    assert plan.startswith("cpu-index: install torch==2.13.0 from https://download.pytorch.org/whl/cpu")
    assert "falling back to the default index" in plan
    assert not fakes["venv"].exists()  # a dry run creates nothing


def test_gpu_installs_from_the_default_index(fakes):
    plan = _torch_plan(_install({"VENV": fakes["venv"], "PYTHON": fakes["no_torch"], "PATH": fakes["gpu_path"],
                                 "TORCH_VERSION": "2.9.1"}))
    assert plan.startswith("default-index: install torch==2.9.1 from the default index")


def test_torch_of_the_given_python_is_kept(fakes):
    import torch

    venv_python = sys.executable  # .venv's: a venv, whose torch is not in the base Python's site-packages
    proc = _install({"VENV": fakes["venv"], "PYTHON": venv_python, "PATH": fakes["nogpu_path"]})
    plan = _torch_plan(proc)
    assert f"create venv {fakes['venv']} from PYTHON={venv_python}" in proc.stdout
    assert plan.startswith(f"keep-python: keep torch {torch.__version__} of PYTHON={venv_python}")


@pytest.mark.slow
def test_venv_from_a_venv_python_imports_its_torch(fakes):
    """DRY_RUN=venv creates the venv for real (nothing installed): it imports PYTHON's torch, not a new one."""
    import torch

    proc = _install({"VENV": fakes["venv"], "PYTHON": sys.executable,
                     "PATH": fakes["nogpu_path"]}, dry_run="venv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = "import torch, os; print(torch.__version__, os.path.realpath(torch.__file__))"
    out = subprocess.run([str(fakes["venv"] / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [torch.__version__, os.path.realpath(torch.__file__)]
    assert not (fakes["venv"] / ".diverse-fairseq-installed").exists()


@pytest.mark.parametrize("env,message", [
    ({"PYTHON": "py310"}, r"PYTHON=.*python3\.10 is Python 3\.10; diverse-fairseq installs on Python 3\.11 or 3\.12"),
    ({"PYTHON": "/nonexistent/python3"}, r"PYTHON=/nonexistent/python3 does not run: set PYTHON"),
    ({"DRY_RUN": "yes"}, r"DRY_RUN=yes is not valid: use DRY_RUN=1"),
    ({"PYTHON": "old_torch"}, r"the torch to keep \(1\.13\.1, in /opt/old/site-packages\) is older than 2\.0"),
], ids=["python-3.10", "python-missing", "dry-run-value", "torch-1.x"])
def test_bad_settings_are_refused_before_any_work(fakes, env, message):
    env = {k: fakes.get(v, v) for k, v in env.items()}
    dry_run = env.pop("DRY_RUN", "0")  # a real install: it must stop before creating anything
    proc = _install({"VENV": fakes["venv"], **env}, dry_run=dry_run)
    assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr
    assert not fakes["venv"].exists()


def test_make_passes_python_to_the_script_and_test_demo_install_first(fakes):
    proc = subprocess.run(["make", "-s", "install", f"VENV={fakes['venv']}", f"PYTHON={fakes['py310']}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"PYTHON={fakes['py310']} is Python 3.10" in proc.stderr, proc.stderr
    for target, then in (("test", "-m pytest"), ("demo", "-m diverse_fairseq.tables demo")):
        dry = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={fakes['venv']}"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        assert dry[0] == f"VENV={fakes['venv']} bash scripts/install.sh" and then in dry[-1], dry


def test_pyproject_python_versions_are_the_scripts():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    accepted = re.search(r'^PYTHON_VERSIONS="([^"]+)"', SCRIPT.read_text(), re.M).group(1).split()
    assert accepted == ["3.11", "3.12"]
    assert project["requires-python"] == ">=3.11,<3.13"
    classified = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert classified == accepted
    assert "%d.%d" % sys.version_info[:2] in accepted  # the interpreter running the tests is one of them


PIP_ERROR = ("ERROR: pip's dependency resolver does not currently take into account all the packages that are "
             "installed. This behaviour is the source of the following dependency conflicts.\n"
             "fairseq-fixed 0.12.3.1 requires torchaudio>=0.8.0, which is not installed.")


def test_the_expected_torchaudio_error_of_pip_is_explained_where_it_is_printed(tmp_path):
    """A venv whose python stands in for pip: the editable install prints pip's resolver ERROR about fairseq's
    torchaudio pin, as the real one does; the script's explanation follows it directly, and the install goes on."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _exe(venv / "bin" / "python", f"""case "$*" in
  *"import fairseq, torch, diverse_fairseq; print"*) echo "[install] ok: torch 2.13.0 fairseq 0.12.3.1";;
  *sys.version_info*) echo 3.11;;
  *torch.__version__*) printf "2.13.0\\t/fake/site-packages\\n";;
  *"pip install"*" -e "*) printf '%s\\n' "{PIP_ERROR}" >&2;;
esac
exit 0""")
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TORCH_CPU_INDEX", "TORCH_VERSION", "DRY_RUN")}
    proc = subprocess.run(["bash", str(SCRIPT)], env=dict(full, VENV=str(venv)), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    out = proc.stdout.splitlines()
    error = out.index(PIP_ERROR.splitlines()[-1])
    assert out[error + 1].startswith('[install] note: the pip ERROR above, "fairseq-fixed ... requires torchaudio ..., '
                                     'which is not installed", is expected and harmless'), out
    assert sum("[install] note:" in line for line in out) == 1  # only where pip printed it
    assert (venv / ".diverse-fairseq-installed").exists()


def test_make_help_lists_every_target():
    """Every target of the Makefile's .PHONY line (but help itself) has a line in ``make help``."""
    makefile = (REPO / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split()
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    missing = [t for t in phony if t != "help" and not re.search(rf"^make {re.escape(t)}\b", shown, re.M)]
    assert not missing, f"make help does not list {missing}"
