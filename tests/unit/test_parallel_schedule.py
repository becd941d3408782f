"""The parallel run's schedule data (tests/file_durations.py): the files it names exist,
and every module running real Spark shares the Spark worker."""

from __future__ import annotations

from pathlib import Path

from tests import file_durations

ROOT = Path(__file__).resolve().parents[2]


def test_same_worker_files_exist():
    for paths in file_durations.SAME_WORKER_FILES.values():
        for path in paths:
            assert (ROOT / path).is_file(), path


def test_every_spark_module_shares_the_spark_worker():
    spark = set(file_durations.SAME_WORKER_FILES["spark"])
    running_spark = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if any(line.startswith("skip_module_without_spark(") for line in p.read_text().splitlines())
    }
    assert running_spark <= spark, (
        "add these Spark modules to SAME_WORKER_FILES['spark'] in tests/file_durations.py: "
        f"{sorted(running_spark - spark)}"
    )


def test_durations_name_existing_files_and_order_units_by_total():
    durations = file_durations.load()
    assert durations, "tests/file_durations.json is missing or empty"
    assert all((ROOT / path).is_file() for path in durations)
    assert file_durations.work_unit("tests/e2e/test_compaction.py") == "spark"
    assert file_durations.work_unit("tests/unit/test_config.py") == "tests/unit/test_config.py"
    assert file_durations.expected_s("tests/e2e/test_new_file.py", {}) == 30.0
    assert file_durations.expected_s("tests/unit/test_new_file.py", {}) == 1.0
