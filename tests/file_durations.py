"""Each test file's duration in a full run (tests/file_durations.json), for the order in
which `tests/run.sh`'s parallel workers take files: the longest first, so the workers end
together instead of one running a 100 s e2e file alone at the end.

`python tests/file_durations.py JUNIT_XML` rewrites the JSON from a full run's report
(tests/run.sh writes one: `--junitxml`); a file the JSON does not know yet (a new test
file) is scheduled by its directory's typical duration.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

DURATIONS_PATH = Path(__file__).with_name("file_durations.json")
# a file not in the JSON: e2e files start clusters (tens of seconds), unit files take ~1 s
UNKNOWN_FILE_S = {"tests/e2e": 30.0, "tests/integration": 10.0}
UNKNOWN_OTHER_FILE_S = 1.0

# test files a parallel run keeps in one worker, one after the other: each runs real Spark
# (a JVM with local[2] and its Python workers); two of them at once on 2 cores (beside the
# clusters they read) starved each other's jobs past their tests' bounds in a parallel run
SAME_WORKER_FILES = {
    "spark": (
        "tests/e2e/test_compacted_topics.py",
        "tests/e2e/test_compaction.py",
        "tests/e2e/test_readme_walkthrough.py",
        "tests/e2e/test_table_topics.py",
        "tests/e2e/test_table_topics_rest.py",
        "tests/e2e/test_topic_source.py",
    ),
}
_UNIT_OF_FILE = {path: unit for unit, paths in SAME_WORKER_FILES.items() for path in paths}


def work_unit(path: str) -> str:
    """The unit of work a parallel run hands one worker for the test file `path`: the file
    itself, or its SAME_WORKER_FILES group."""
    return _UNIT_OF_FILE.get(path, path)


def load() -> dict[str, float]:
    """Seconds by test file path relative to the repository (`tests/e2e/test_x.py`);
    empty when the JSON is missing or unreadable (the order then is by directory)."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS_PATH.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def expected_s(path: str, durations: dict[str, float]) -> float:
    """The expected seconds of the test file `path` (relative, with `/`)."""
    if path in durations:
        return durations[path]
    for prefix, seconds in UNKNOWN_FILE_S.items():
        if path.startswith(prefix + "/"):
            return seconds
    return UNKNOWN_OTHER_FILE_S


def from_junit(junit_path: str) -> dict[str, float]:
    """Seconds by test file summed over a JUnit report's test cases (setup and teardown
    included, so a module fixture's cluster counts)."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if module is not None:
            seconds["/".join(parts[: module + 1]) + ".py"] += float(case.get("time") or 0)
    return {path: round(s, 1) for path, s in sorted(seconds.items())}


if __name__ == "__main__":
    measured = from_junit(sys.argv[1])
    DURATIONS_PATH.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    print(f"{len(measured)} files, {sum(measured.values()):.0f} s, written to {DURATIONS_PATH}")
