"""RunningStretch: a gap between a thread's checks means its process did not run, and the
bucket switch then counts a stall only from the resume (a stopped broker's PUT in flight is
not a stalled bucket)."""

from __future__ import annotations

import pytest

from dataplane.s3stream.wal.running_stretch import RunningStretch


def test_steady_checks_keep_one_stretch() -> None:
    stretch = RunningStretch(100.0, max_gap_s=1.0)
    for i in range(1, 31):
        assert stretch.observe(100.0 + i * 0.1) == 0.0
    assert stretch.running_s(103.0) == pytest.approx(3.0)


def test_a_stop_starts_the_stretch_over_at_the_resume() -> None:
    stretch = RunningStretch(100.0, max_gap_s=1.0)
    stretch.observe(100.1)
    # stopped for 6 s (SIGSTOP, a paused VM): the first check after it sees the gap
    assert stretch.observe(106.1) == pytest.approx(6.0)
    assert stretch.running_s(106.1) == 0.0
    # a PUT begun just before the stop has waited 6.5 s at 106.6; the process ran 0.5 s of it
    assert stretch.running_s(106.6) == pytest.approx(0.5)
    assert stretch.observe(106.2) == 0.0
    assert stretch.running_s(108.1) == pytest.approx(2.0)  # a true stall counts again


def test_a_gap_up_to_the_bound_is_not_a_stop() -> None:
    stretch = RunningStretch(0.0, max_gap_s=1.0)
    assert stretch.observe(1.0) == 0.0
    assert stretch.running_s(1.0) == 1.0


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_gap_s"):
        RunningStretch(0.0, max_gap_s=0.0)
