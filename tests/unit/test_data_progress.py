"""The data stage's progress line (rayline/data/progress.py): rows, rate and time left."""

from rayline.data.progress import PhaseProgress


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rows_rate_and_time_left_from_the_rows_when_the_total_is_known():
    clock, lines = _Clock(), []
    progress = PhaseProgress(lines.append, "transforming train", total_rows=1_000_000, every_s=1.0, clock=clock)
    clock.now += 2.0
    progress.add(250_000)
    assert lines == ["transforming train 250,000 of 1,000,000 rows, 125,000 rows/s, ~6 s left"]
    clock.now += 0.5
    progress.add(250_000)  # within every_s of the last line: none
    assert len(lines) == 1
    clock.now += 0.5
    progress.add(100_000)
    assert lines[-1] == "transforming train 600,000 of 1,000,000 rows, 200,000 rows/s, ~2 s left"


def test_time_left_from_the_blocks_when_only_they_are_known():
    clock, lines = _Clock(), []
    progress = PhaseProgress(lines.append, "reading", total_blocks=8, every_s=0, clock=clock)
    clock.now += 3.0
    progress.add(40_000, 2)
    assert lines == ["reading 40,000 rows (2 of 8 blocks), 13,333 rows/s, ~9 s left"]


def test_no_estimate_without_a_total_and_no_line_without_a_listener():
    clock = _Clock()
    lines = []
    progress = PhaseProgress(lines.append, "reading", every_s=0, clock=clock)
    clock.now += 1.0
    progress.add(10)
    assert lines == ["reading 10 rows, 10 rows/s"]
    silent = PhaseProgress(None, "reading", every_s=0, clock=clock)
    silent.add(5)
    assert silent.rows == 5
