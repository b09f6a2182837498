"""The repository documents itself: no references to files outside it, links that resolve, citation metadata
that parses, and documentation tables that agree with the code and the table descriptions they describe."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from diverse_fairseq.data.senteval import TASKS

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKDOWN = [REPO / "README.md", *DOCS]

TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".cff", ".cfg", ".ini", ".txt"}
TEXT_NAMES = {"Makefile", "LICENSE", ".gitignore"}
# Documents that lived outside the repository while it was written; spelled in pieces so that this file
# does not mention them itself.
FORBIDDEN = [
    re.compile(r"\b" + "SP" + r"EC\b"),
    re.compile(re.escape("FAIRSEQ" + "-NOTES")),
    re.compile(re.escape(".." + "/shared")),
    re.compile(re.escape("/work" + "/shared")),
]


def repo_text_files():
    """Tracked and untracked-but-not-ignored text files of the repository."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        paths = [REPO / p for p in out]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        skip = {".git", ".venv", "work", "data-bin", "results", "checkpoints", "build"}
        paths = [p for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)]
    return [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES)]


def test_no_references_to_documents_outside_the_repository():
    hits = []
    for path in repo_text_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if any(p.search(line) for p in FORBIDDEN):
                hits.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:120]}")
    assert not hits, "references to documents that are not in the repository (point to docs/ instead):\n" + \
        "\n".join(hits)


# ---------------------------------------------------------------------------------------------- links

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def github_anchors(text: str):
    """The anchors GitHub gives the headings of a markdown file."""
    anchors, seen = set(), {}
    for _, title in _HEADING.findall(_FENCE.sub("", text)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def relative_links(path: Path):
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        yield target


def test_github_anchors_follow_githubs_rules():
    text = "# A `code` Title\n## Routing-by-agreement aggregation\n## Mixed precision\n## Mixed precision\n"
    assert github_anchors(text) == {"a-code-title", "routing-by-agreement-aggregation", "mixed-precision",
                                    "mixed-precision-1"}


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_markdown_links_resolve(path):
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if REPO in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{path.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


# ---------------------------------------------------------------------------------------------- citation


def test_citation_cff_parses_and_has_the_required_keys():
    data = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert str(data["cff-version"]) == "1.2.0"
    for key in ("message", "title", "authors"):
        assert data[key], key
    assert data["license"] == "MIT"
    refs = data["references"]
    for ref in refs:
        for key in ("type", "title", "authors", "year"):
            assert ref.get(key), f"reference {ref.get('title')!r} lacks {key}"
        for author in ref["authors"]:
            assert author.get("family-names") and author.get("given-names"), author
    # the four papers the project implements
    dois = {str(r.get("doi")) for r in refs}
    assert dois == {"10.18653/v1/D18-1317", "10.18653/v1/N19-1359", "10.1016/j.neucom.2021.04.038",
                    "10.18653/v1/2020.emnlp-main.17"}


def test_package_version_matches_citation():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert str(yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))["version"]) == version


# ---------------------------------------------------------------------------------------------- tables


def markdown_tables(text: str):
    """{heading: [table, ...]} with each table a list of rows (lists of cell strings), header row first."""
    tables, heading, current = {}, None, None
    for line in _FENCE.sub("", text).splitlines():
        m = _HEADING.match(line)
        if m:
            heading, current = m.group(2), None
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            if current is None:
                current = []
                tables.setdefault(heading, []).append(current)
            current.append(cells)
        else:
            current = None
    return tables


PAPER_COLUMNS = {"BLEU": "bleu", "# Para. (M)": "params", "train steps/s": "train_speed",
                 "decode sent/s": "decode_speed", "time per step": "relative_step_time", "Sub.": "sub_score",
                 "Pos.": "pos_score", "Out.": "out_score", **{f"Pos. L{i}": f"pos_score_layer{i}" for i in range(1, 7)},
                 **{t.column: t.paper_key for t in TASKS}}  # probing accuracies (naacl19_t1, journal_t7)


def test_paper_settings_tables_match_the_table_descriptions():
    from diverse_fairseq.tables.spec import TABLE_DIR, load_table

    tables = markdown_tables((REPO / "docs" / "paper-settings.md").read_text(encoding="utf-8"))
    for path in sorted(TABLE_DIR.glob("*.yaml")):
        if path.stem == "demo":
            continue
        table = load_table(path)
        heading = f"`{table.table}`"
        assert heading in tables, f"docs/paper-settings.md has no section {heading} for {path.name}"
        header, *rows = tables[heading][0]
        assert [r[0] for r in rows] == [r.label for r in table.rows], heading
        for cells, row in zip(rows, table.rows):
            for title, cell in zip(header[1:], cells[1:]):
                key = PAPER_COLUMNS[title]
                if cell == "–":
                    assert key not in row.paper, (heading, row.id, key)
                else:
                    assert float(cell) == pytest.approx(float(row.paper[key])), (heading, row.id, key)


def test_paper_settings_training_table_matches_the_code():
    from diverse_fairseq.runs.settings import SETTINGS

    tables = markdown_tables((REPO / "docs" / "paper-settings.md").read_text(encoding="utf-8"))
    header, *rows = tables["Our training settings"][0]
    assert header[:2] == ["setting", "architecture"]
    assert sorted(r[0].strip("`") for r in rows) == sorted(SETTINGS)
    for cells in rows:
        s = SETTINGS[cells[0].strip("`")]
        values = dict(zip(header, cells))
        assert values["architecture"].strip("`") == s.arch
        assert float(values["peak lr"]) == pytest.approx(s.lr)
        assert int(values["warm-up"]) == s.warmup
        assert float(values["dropout"]) == pytest.approx(s.dropout)
        assert float(values["weight decay"]) == pytest.approx(s.weight_decay)
        assert int(values["tokens per update"]) == s.batch_tokens
        assert int(values["updates"]) == s.max_update


# ---------------------------------------------------------------------------------------------- flag defaults


def flag_defaults():
    """{--flag: default} of the plugin's options, from the code."""
    from dataclasses import fields

    from diverse_fairseq.methods.disagreement.criterion import LabelSmoothedCrossEntropyWithDisagreementConfig
    from diverse_fairseq.methods.repulsive.optimizer import RepulsiveAdamConfig
    from diverse_fairseq.methods.routing.options import ROUTING_DEFAULTS

    defaults = {}
    for cfg in (LabelSmoothedCrossEntropyWithDisagreementConfig, RepulsiveAdamConfig):
        for f in fields(cfg):
            if f.name.startswith(("disagreement_", "repulsive_")):
                defaults["--" + f.name.replace("_", "-")] = f.default
    defaults.update({"--" + k.replace("_", "-"): v for k, v in ROUTING_DEFAULTS.items()})
    return defaults


def test_documented_flag_defaults_match_the_code():
    defaults = flag_defaults()
    checked, wrong = 0, []
    for path in MARKDOWN:
        for heading, tables in markdown_tables(path.read_text(encoding="utf-8")).items():
            for table in tables:
                if table[0][:2] != ["flag", "default"]:
                    continue
                for cells in table[1:]:
                    flags = re.findall(r"`(--[a-z0-9-]+)`", cells[0])
                    documented = re.findall(r"`([^`]*)`", cells[1])
                    if len(flags) != len(documented):  # e.g. "all" or "E": described, not a literal value
                        continue
                    for flag, doc in zip(flags, documented):
                        assert flag in defaults, f"{path.name}: {flag} is not an option of the plugin"
                        code = defaults[flag]
                        checked += 1
                        if code is None or str(code) != doc and not _same_number(code, doc):
                            wrong.append(f"{path.name} ({heading}): {flag} documented {doc!r}, code {code!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 20, checked  # the tables of README.md and docs/methods.md were found


def _same_number(code, doc) -> bool:
    try:
        return float(code) == float(doc)
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------ architecture

def test_architecture_page_names_every_method_module_and_only_existing_files():
    """docs/architecture.md stays true: every path to a .py file it names exists (relative to diverse_fairseq/ or the
    repository), every module of diverse_fairseq/methods/ appears in it, and methods never import the workflow."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = {p for p in re.findall(r"[\w/]+\.py", text) if "/" in p}  # paths (the tree shows bare names)
    assert len(named) >= 15, named
    missing = [p for p in named if not (REPO / "diverse_fairseq" / p).is_file() and not (REPO / p).is_file()]
    assert not missing, f"docs/architecture.md names files that do not exist: {sorted(missing)}"
    tree = text[text.index("```"):]
    for path in sorted((REPO / "diverse_fairseq" / "methods").rglob("*.py")):
        if path.name != "__init__.py":
            assert path.name in tree, f"docs/architecture.md does not show {path.relative_to(REPO)}"
        source = path.read_text(encoding="utf-8")
        imports = re.findall(r"^\s*(?:from|import) (diverse_fairseq\.\w+)", source, re.M)
        assert all(i == "diverse_fairseq.methods" for i in imports), (path, imports)


def test_readme_stays_a_short_path():
    """The README is the newcomer's short path; reference material lives in docs/ (issue 27)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines: move reference material into docs/"
    for command in ("make demo", "make test"):
        assert any(line.startswith(command) for line in lines), f"README.md lacks the command {command!r}"
