"""Print each failed test of a pytest JUnit XML report with the head of its error, so the
last lines of a red run say what failed and why."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

MAX_LINES_PER_FAILURE = 12
MAX_FAILURES = 20


def digest(junit_path: str) -> list[str]:
    """The digest's lines: one block per failed or errored test case."""
    root = ET.parse(junit_path).getroot()
    lines: list[str] = []
    failed = 0
    for case in root.iter("testcase"):
        for problem in list(case.findall("failure")) + list(case.findall("error")):
            failed += 1
            if failed > MAX_FAILURES:
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            lines.append(f"--- {problem.tag}: {name}")
            text = (problem.get("message") or "") + "\n" + (problem.text or "")
            # the assertion lines ("E ...") say why; the message is the fallback
            reasons = [ln for ln in text.splitlines() if ln.startswith("E ")]
            shown = reasons or [ln for ln in text.splitlines() if ln.strip()]
            lines.extend("    " + ln[:300] for ln in shown[:MAX_LINES_PER_FAILURE])
    if failed > MAX_FAILURES:
        lines.append(f"... and {failed - MAX_FAILURES} more")
    return [f"failure digest: {failed} failed"] + lines


if __name__ == "__main__":
    try:
        print("\n".join(digest(sys.argv[1])))
    except (OSError, ET.ParseError, IndexError) as exc:
        print(f"no failure digest: {exc}")
