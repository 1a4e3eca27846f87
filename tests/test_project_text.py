"""The project speaks of itself: README.md, docs/, camrender/, kernels/ and bench/ (file names and text) say nothing
of the sessions or issues that made them, the docs' relative links lead somewhere, and every raw result the text
names is in bench/results/, named by its date and what it measures."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("README.md", "docs", "camrender", "kernels", "bench")
RESULTS = ROOT / "bench" / "results"

# Every "session" or "issue" (any case, inside words too) must have one of these meanings; "issue 24", "the fifth
# session", "session25_..." have none. Add a meaning here, with what it is, only where the text means it.
WORD = re.compile(r"session|issue", re.IGNORECASE)
LEGITIMATE = re.compile(r"""
      ClientSession | \bsession\.ws_connect | \bas\ session\b                 # aiohttp's HTTP client session
    | play[/.]session | `session` | session_files                              # `camrender play`'s module, its files
    | (live|saved|play`?)\ sessions? | sessions?\ (stem|saved|it\ saves|was\ stopped|to\ be\ saved)
    | saving\ the\ session                                                      # a flight of `camrender play`
    | \bissu(ed|ing)\b | \bissues?\ (a|an|the|its|their|one|each)\b            # the verb: to issue launches
""", re.IGNORECASE | re.VERBOSE)
# numbered or counted: wrong whatever the words around them
NUMBERED = re.compile(r"""
      (session|issue)s?\W{0,2}\#?\d
    | \b\d+(st|nd|rd|th)\W+(session|issue)
    | \b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|twent\w*
         |thirt\w*|earlier|previous|last|next|this|that)[\s-]+sessions?\b
""", re.IGNORECASE | re.VERBOSE)
RESULT_NAME = re.compile(r"\d{4}-\d{2}-\d{2}_[a-z0-9_]+\.json")
RESULT_MENTION = re.compile(r"(?:bench/results/)?(\d{4}-\d{2}-\d{2}_[A-Za-z0-9_*]+(?:\.json)?)")


def checked_files():
    """(path relative to the root, text or None for a file that is not UTF-8 text) of every file under CHECKED."""
    for top in CHECKED:
        path = ROOT / top
        if path.is_file():
            yield top, path.read_text(encoding="utf-8")
            continue
        for folder, subfolders, names in os.walk(path):  # symlinks (camrender/kernels) not followed
            subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
            for name in sorted(names):
                file = Path(folder) / name
                try:
                    text = file.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    text = None
                yield file.relative_to(ROOT).as_posix(), text


def self_references(line: str) -> list:
    """The words of `line` that speak of sessions or issues: numbered ones, and any without a legitimate meaning."""
    found = [match.group(0) for match in NUMBERED.finditer(line)]
    allowed = [match.span() for match in LEGITIMATE.finditer(line)]
    for match in WORD.finditer(line):
        if not any(start <= match.start() and match.end() <= end for start, end in allowed):
            found.append(line[max(0, match.start() - 20):match.end() + 20].strip())
    return found


def test_the_text_and_file_names_say_nothing_of_sessions_or_issues():
    found = []
    for name, text in checked_files():
        found += [f"{name}: {word}" for word in self_references(name)]
        for number, line in enumerate((text or "").splitlines(), 1):
            found += [f"{name}:{number}: {word}" for word in self_references(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line, words", [
    ("measured in the twenty-fifth session", 1), ("before issue 24", 1), ("bench/run_issue25.sh", 1),
    ("session25_issue24_h200.json", 1), ("Issue #16's list", 1), ("an earlier session measured", 1),
    ("async with ClientSession() as session, session.ws_connect(url) as ws:", 0),
    ("from camrender.play.session import Flight", 0), ("the saved session's mp4", 0), ("a live session 24", 1),
    ("the host issued the copies", 0), ("a known issue", 1),
])
def test_the_check_tells_the_meanings_apart(line, words):
    assert bool(self_references(line)) == bool(words), self_references(line)


def heading_anchors(text: str) -> set:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if line.startswith("#")}


def test_every_relative_link_of_the_readme_and_docs_leads_somewhere():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text("utf-8")):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_raw_result_named_in_the_text_exists_and_is_named_by_date_and_measure():
    misnamed = [path.name for path in RESULTS.iterdir() if not RESULT_NAME.fullmatch(path.name)]
    assert not misnamed, misnamed
    missing = []
    for name, text in checked_files():
        if name.startswith("bench/results/"):
            continue
        for mention in RESULT_MENTION.findall(text or ""):
            if not any(RESULTS.glob(mention if mention.endswith((".json", "*")) else mention + "*")):
                missing.append(f"{name}: {mention}")
    assert not missing, "\n".join(missing)
