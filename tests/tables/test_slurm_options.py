"""LAUNCHER=slurm's options, checked before any work, without a cluster (the jobs on a real one: test_slurm.py)."""

import pytest

from diverse_fairseq.runs import options
from diverse_fairseq.tables.__main__ import main, parse_options, slurm_variable_warnings
from diverse_fairseq.tables.options import check_gpus
from diverse_fairseq.tables.slurm import SlurmOptions

ENV_KEYS = ("LAUNCHER", "PARTITION", "ACCOUNT", "QOS", "CONSTRAINT", "TIME_LIMIT", "SBATCH_ARGS", "NODES", "WAIT",
            "RESUBMIT", "GPUS")


def test_the_options_from_flags_and_variables():
    env = {"LAUNCHER": "slurm", "TIME_LIMIT": "1-02:00:30", "SBATCH_ARGS": "--mem=64G --exclusive", "NODES": "2",
           "RESUBMIT": "failed", "PARTITION": "gpu"}
    o = parse_options(["demo", "--wait", "0", "--partition", "big"], env)
    assert o.launcher == "slurm"
    assert o.slurm == SlurmOptions(partition="big", time_limit=26 * 60 + 1, nodes=2, wait=0.0, resubmit_failed=True,
                                   sbatch_args=(("mem", "64G"), ("exclusive", True)))
    assert parse_options(["demo"], {}).launcher == "local" and parse_options(["demo"], {}).slurm == SlurmOptions()
    assert options.resolve(SlurmOptions, {"TIME_LIMIT": "90"}).time_limit == 90
    assert options.resolve(SlurmOptions, {"TIME_LIMIT": "0:00:01"}).time_limit == 1  # rounded up to a minute


@pytest.mark.parametrize("env, message", [
    ({"LAUNCHER": "SLURM"}, "LAUNCHER (--launcher)='SLURM' is not valid"),
    ({"TIME_LIMIT": "2 days"}, "give minutes (e.g. 90) or D-HH:MM:SS"),
    ({"TIME_LIMIT": "0"}, "at least 1 minute"),
    ({"SBATCH_ARGS": "-p gpu"}, "write each sbatch option as --name=value or --flag (not '-p')"),
    ({"SBATCH_ARGS": "--mem 64G"}, "(not '64G')"),
    ({"SBATCH_ARGS": "--time=60"}, "leave out --time: the launcher sets it (use TIME_LIMIT)"),
    ({"SBATCH_ARGS": "--output=x.log"}, "leave out --output: the launcher sets it"),
    ({"NODES": "0"}, "NODES (--nodes)='0' is not valid"),
    ({"RESUBMIT": "all"}, "RESUBMIT (--resubmit)='all' is not valid"),
    ({"WAIT": "-1"}, "WAIT (--wait)='-1' is not valid"),
])
def test_bad_values_are_refused_naming_the_variable(env, message):
    with pytest.raises(SystemExit) as refused:
        parse_options(["demo"], env)
    assert message in str(refused.value.code)


def test_the_nodes_gpus_must_be_given_and_are_not_this_machines(monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as refused:
        check_gpus(parse_options(["demo"], {"LAUNCHER": "slurm"}), {})
    assert "LAUNCHER=slurm needs GPUS, the GPUs per node of each job" in str(refused.value.code)
    check_gpus(parse_options(["demo"], {"LAUNCHER": "slurm", "GPUS": "8"}), {"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(SystemExit):  # the local launcher: more GPUs than this machine shows
        check_gpus(parse_options(["demo"], {"GPUS": "8"}), {"CUDA_VISIBLE_DEVICES": ""})
    # refused before any work: nothing prepared, nothing written
    monkeypatch.setenv("LAUNCHER", "slurm")
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "r"), "--data-bin", str(tmp_path / "d")])
    assert not list(tmp_path.iterdir())


def test_the_other_launchers_variables_are_named():
    env = {"PARTITION": "gpu", "TIME_LIMIT": "60", "SEEDS": "2"}
    assert slurm_variable_warnings("local", env) == ["PARTITION, TIME_LIMIT: LAUNCHER=slurm's, ignored by "
                                                     "LAUNCHER=local"]
    assert slurm_variable_warnings("slurm", env) == [] and slurm_variable_warnings("local", {"SEEDS": "2"}) == []
    assert slurm_variable_warnings("slurm", {"JOBS": "4"}) == ["JOBS: LAUNCHER=local's, ignored by LAUNCHER=slurm"]
