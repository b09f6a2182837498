"""The significance tool against hand-computable cases and against sacrebleu's own paired bootstrap."""

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diverse_fairseq.significance import compare, main, paired_bootstrap, sign_test, sign_test_p

WORDS = "the a cat dog sat ran on under mat table house red blue big small quickly".split()


def corpus(n=30, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) for _ in range(n)]


def degrade(sentences, seed, rate):
    """Replace a fraction ``rate`` of the words by a word that is never in the references."""
    rng = random.Random(seed)
    return [" ".join("xyz" if rng.random() < rate else w for w in s.split()) for s in sentences]


def write(path, lines):
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_sign_test_exact_binomial():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 0) == pytest.approx(0.25)  # 2 * (1/2)^3
    assert sign_test_p(5, 1) == pytest.approx(2 * (1 + 6) / 64)  # 2 * (C(6,0) + C(6,1)) / 2^6
    assert sign_test_p(10, 10) == 1.0


def test_identical_systems_are_not_significant():
    refs = corpus()
    hyps = degrade(refs, 1, 0.3)
    _, boot = paired_bootstrap(hyps, {"same": hyps}, refs)
    assert boot["same"]["p_value"] == 1.0 and boot["same"]["bleu"] == boot["baseline"]["bleu"]
    assert sign_test(hyps, hyps, refs) == {"better": 0, "worse": 0, "ties": len(refs), "p_value": 1.0}


def test_a_system_better_on_every_sentence_is_significant():
    refs = corpus(30)
    baseline = [" ".join(r.split()[:-2]) for r in refs]  # every sentence misses its last two words
    result = sign_test(baseline, refs, refs)
    assert result == {"better": 30, "worse": 0, "ties": 0, "p_value": pytest.approx(2 * 0.5 ** 30)}
    assert sign_test(refs, baseline, refs)["worse"] == 30  # and the other way round
    _, boot = paired_bootstrap(baseline, {"perfect": refs}, refs)
    assert boot["perfect"]["p_value"] < 0.01 and boot["perfect"]["bleu"] == pytest.approx(100.0)


def test_matches_sacrebleu_paired_bootstrap_command_line(tmp_path):
    refs = corpus(40, 3)
    a, b = degrade(refs, 4, 0.35), degrade(refs, 5, 0.25)
    ref_f, a_f, b_f = write(tmp_path / "ref", refs), write(tmp_path / "a", a), write(tmp_path / "b", b)
    ours = compare(ref_f, a_f, [b_f])
    proc = subprocess.run([sys.executable, "-m", "sacrebleu", ref_f, "-i", a_f, b_f, "--paired-bs", "-f", "json"],
                          capture_output=True, text=True, check=True)
    theirs = json.loads(proc.stdout)
    assert theirs[1]["BLEU"]["p_value"] == pytest.approx(ours["systems"][0]["p_value"])
    assert theirs[1]["BLEU"]["ci"] == pytest.approx(ours["systems"][0]["ci95"])
    assert theirs[1]["BLEU"]["mean"] == pytest.approx(ours["systems"][0]["mean"])
    assert theirs[0]["BLEU"]["ci"] == pytest.approx(ours["baseline"]["ci95"])
    assert "bs:1000" in ours["signature"] and "seed:12345" in ours["signature"]


def test_command_line_table_and_json(tmp_path, capsys):
    refs = corpus(20, 6)
    ref_f = write(tmp_path / "ref", refs)
    a_f = write(tmp_path / "a", degrade(refs, 7, 0.4))
    main(["--ref", ref_f, "--baseline", a_f, "--system", ref_f, a_f])
    table = capsys.readouterr().out
    assert "p(boot)" in table and "p(sign)" in table and "20/0/0" in table
    main(["--ref", ref_f, "--baseline", a_f, "--system", ref_f, "--json", "--tokenize", "none"])
    data = json.loads(capsys.readouterr().out)
    assert data["systems"][0]["sign_test"]["better"] == 20 and data["systems"][0]["bootstrap_mark"] == "**"
    with pytest.raises(SystemExit, match="has 19 lines"):
        main(["--ref", ref_f, "--baseline", a_f, "--system", write(tmp_path / "short", refs[:19])])


def _evaluation(root: Path, run: str, refs, hyps) -> str:
    """An output folder as diverse_fairseq.evaluate writes it: every run's hypotheses are hyp.detok.de."""
    out = root / "checkpoints" / run / "eval-demo-test-checkpoint_best"
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps({"checkpoint": f"checkpoints/{run}/checkpoint_best.pt"}))
    write(out / "ref.detok.de", refs)
    return write(out / "hyp.detok.de", hyps)


def test_systems_in_the_evaluate_layout_are_labelled_by_their_run(tmp_path, capsys):
    refs = corpus(20, 8)
    base = _evaluation(tmp_path, "transformer_seed1", refs, degrade(refs, 9, 0.4))
    better = _evaluation(tmp_path, "disagreement_seed1", refs, degrade(refs, 10, 0.2))
    main(["--ref", str(Path(base).parent / "ref.detok.de"), "--baseline", base, "--system", better])
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("transformer_seed1/checkpoint_best ") and table[2].endswith("(baseline)")
    assert table[3].startswith("disagreement_seed1/checkpoint_best ")
    result = compare(str(Path(base).parent / "ref.detok.de"), base, [better])
    assert (result["baseline"]["label"], result["systems"][0]["label"]) == \
        ("transformer_seed1/checkpoint_best", "disagreement_seed1/checkpoint_best")
    # plain files with the same name: their paths from the common folder tell them apart
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    result = compare(write(tmp_path / "ref", refs), write(a / "hyp.txt", refs), [write(b / "hyp.txt", refs)])
    assert (result["baseline"]["label"], result["systems"][0]["label"]) == ("a/hyp.txt", "b/hyp.txt")


@pytest.mark.parametrize("option", ["--ref", "--baseline", "--system"])
def test_a_missing_file_is_named_with_its_option(tmp_path, option):
    refs = corpus(5, 11)
    files = {"--ref": write(tmp_path / "ref", refs), "--baseline": write(tmp_path / "a", refs),
             "--system": write(tmp_path / "b", refs)}
    files[option] = str(tmp_path / "missing.txt")
    with pytest.raises(SystemExit, match=rf"error: \w+ \({option}\) file {tmp_path}/missing\.txt not found: check"):
        main([arg for pair in files.items() for arg in pair])


# ------------------------------------------------------------------ labels, direction, no marks below 1 BLEU
def _trained(tmp_path, extra):
    """A save directory as ``scripts/train.sh demo tiny EXTRA`` leaves it (its train_args.json written by training,
    fairseq-train replaced by a script that does nothing)."""
    from dataclasses import replace

    from conftest import fake_prepared

    from diverse_fairseq import training

    env = {"DATA_BIN": str(fake_prepared(tmp_path / "data-bin", "demo")), "CHECKPOINTS": str(tmp_path / "ck")}
    (tmp_path / "no_training.py").write_text("")
    request = training.request_from_env("demo", "tiny", extra, env=env, gpus=0)
    return training.train(replace(request, entry=str(tmp_path / "no_training.py")), {}).plan.save_dir


def _evaluated(save_dir: Path, refs, hyps) -> str:
    """evaluate's default output folder of ``save_dir/checkpoint_last.pt``: its hypotheses' file."""
    out = save_dir / "eval-demo-test-checkpoint_last"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"checkpoint": str(save_dir / "checkpoint_last.pt")}))
    write(out / "ref.detok.de", refs)
    return write(out / "hyp.detok.de", hyps)


def _swapped(refs, wins, losses):
    """(baseline, system): the system's sentence is the reference on ``wins`` sentences and a poor one on
    ``losses``, the baseline's the other way round; both have the same poor sentence elsewhere (ties)."""
    poor = [" ".join(r.split()[:3]) for r in refs]
    base = [r if wins <= i < wins + losses else p for i, (r, p) in enumerate(zip(refs, poor))]
    system = [r if i < wins else p for i, (r, p) in enumerate(zip(refs, poor))]
    return base, system


def test_systems_are_labelled_by_method_and_setting_and_each_mark_names_the_better_one(tmp_path, capsys):
    """Issue 38's example: a system that lost 49 sentences and won 26 is marked p(sign) 0.0106*, and the table says
    that the baseline is the better one there; the systems are named by the methods and setting that their
    training recorded, not by the hash of their folders."""
    refs = corpus(100, 12)
    base_hyps, system_hyps = _swapped(refs, 26, 49)
    base = _evaluated(_trained(tmp_path, []), refs, base_hyps)
    system = _evaluated(_trained(tmp_path, ["--arch", "diverse_transformer", "--criterion",
                                            "label_smoothed_cross_entropy_with_disagreement"]), refs, system_hyps)
    capsys.readouterr()  # training's lines
    main(["--ref", str(Path(base).parent / "ref.detok.de"), "--baseline", base, "--system", system])
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("transformer (tiny) ") and table[2].endswith("(baseline)")
    assert table[3].startswith("disagreement_out (tiny) ") and " 26/49/25 " in table[3]
    assert table[3].endswith(" 0.0106*  baseline better") and "** baseline better " in table[3]
    result = compare(str(Path(base).parent / "ref.detok.de"), base, [system])
    assert (result["systems"][0]["bootstrap_better"], result["systems"][0]["sign_better"]) == ("baseline", "baseline")
    # the same methods and setting twice: each also named by its folder and checkpoint
    other = _evaluated(_trained(tmp_path, ["--arch", "diverse_transformer", "--criterion",
                                           "label_smoothed_cross_entropy_with_disagreement", "--lr", "1e-3"]),
                       refs, refs)
    labels = [s["label"] for s in compare(str(Path(base).parent / "ref.detok.de"), base, [system, other])["systems"]]
    assert [label.split(", ")[0] for label in labels] == ["disagreement_out (tiny"] * 2 and labels[0] != labels[1]
    assert all(re.fullmatch(r"disagreement_out \(tiny, demo_tiny-disagreement_out-[0-9a-f]{8}/checkpoint_last\)", x)
               for x in labels)
    assert compare(str(Path(base).parent / "ref.detok.de"), base, [other])["systems"][0]["bootstrap_better"] == \
        "system"


def test_no_marks_where_both_systems_are_below_one_bleu_and_the_output_says_why(tmp_path, capsys):
    """A 100-update table's systems (BLEU ~0.1) differ significantly on the sentences they get a word right; the
    marks would read as an improvement. Below 1 BLEU for both nothing is marked, in this command and in the table
    report (the same function), and the command says why."""
    refs = corpus(100, 13)
    nearly = [r.split()[0] + " zz zz zz zz zz zz zz zz" for r in refs]
    less = ["zz zz zz zz zz zz zz zz zz" if i % 2 else h for i, h in enumerate(nearly)]  # every other one empty
    ref_f = write(tmp_path / "ref", refs)
    main(["--ref", ref_f, "--baseline", write(tmp_path / "base", less), "--system", write(tmp_path / "sys", nearly)])
    table = capsys.readouterr().out.splitlines()
    assert "*" not in table[3] and "better" not in table[3] and " 50/0/50 " in table[3]
    assert table[-1].startswith("sys: not marked: both systems score below 1 BLEU (")
    entry = compare(ref_f, tmp_path / "base", [tmp_path / "sys"])["systems"][0]
    assert entry["p_value"] < 0.01 and entry["sign_test"]["p_value"] < 0.01 and entry["unmarked"]
    assert entry["bootstrap_mark"] == entry["sign_mark"] == entry["bootstrap_better"] == ""
    # nothing to say where no test would have marked anything
    assert "unmarked" not in compare(ref_f, tmp_path / "base", [write(tmp_path / "same", less)])["systems"][0]

    from conftest import job_record

    from diverse_fairseq.tables import report
    from diverse_fairseq.tables.spec import parse_table

    def run(folder, hyps):  # a table row's seed 1 as the report reads it
        (tmp_path / "runs" / folder).mkdir(parents=True)
        write(tmp_path / "runs" / folder / "hyp.detok.de", hyps)
        write(tmp_path / "runs" / folder / "ref.detok.de", refs)
        return [job_record(1, eval={"out": str(tmp_path / "runs" / folder)})]

    rows = [{"id": "base", "label": "B", "family": "transformer"}, {"id": "d", "label": "D", "family": "transformer"}]
    table = parse_table({"table": "t", "title": "a table", "baseline": "base", "rows": rows}, "t.yaml")
    marked = report.significance(table, {"base": run("base", less), "d": run("d", nearly)})["d"]
    assert marked["bootstrap"]["p_value"] < 0.01 and marked["sign_test"]["p_value"] < 0.01
    assert marked["bootstrap"]["mark"] == marked["sign_test"]["mark"] == "" and "below 1 BLEU" in marked["unmarked"]
    # above 1 BLEU the same kind of difference is marked
    marked = report.significance(table, {"base": run("b2", _swapped(refs, 0, 40)[0]), "d": run("d2", refs)})["d"]
    assert marked["bootstrap"]["mark"] == report.DOUBLE_UP and "unmarked" not in marked
