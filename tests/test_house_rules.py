"""House rules a reader of the code relies on (STYLE, DESIGN 2): comments and docs say why,
never which ticket (a reader of the code has no issue tracker)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what a reader reads: the library, its experiments, the docs and the README
READ = ["flux", "exchange", "statemover", "controller", "experiments", "docs"]


def test_no_comment_or_page_cites_an_issue_number():
    cited = []
    files = [ROOT / "README.md"] + [p for folder in READ for p in (ROOT / folder).rglob("*")
                                    if p.suffix in (".py", ".md")]
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bissue [0-9]", line, re.I):
                cited.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not cited, "say the reason, or link the doc that explains it:\n" + "\n".join(cited)
