"""The significance tool against hand-computable cases and against sacrebleu's own paired bootstrap."""

import json
import random
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
