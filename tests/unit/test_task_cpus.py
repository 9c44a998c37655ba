"""What each data task asks for when served models hold most CPUs (rayline/data/task_cpus.py); the
same with a real Ray and a real actor holding the CPUs: tests/integration/test_preprocessing_paths.py."""

import pytest

from rayline.data import task_cpus
from rayline.data.task_cpus import fitted_cpus


@pytest.mark.parametrize("free, expected", [
    (16.0, None), (1.0, None),    # a whole CPU free: Ray Data's own 1 CPU a task, nothing changes
    (0.999, 0.95), (0.45, 0.45), (0.449, 0.4), (0.05, 0.05),  # the free share, down to a twentieth
    (0.049, 0.0), (0.0, 0.0),     # too little: the caller fails naming who holds the CPUs
])
def test_tasks_ask_for_what_is_free(free, expected):
    assert fitted_cpus(free) == expected


def test_args_are_empty_unless_fitted():
    assert task_cpus.remote_args() == {} and task_cpus.map_args() == {}
    task_cpus._task_cpus = 0.25
    try:
        assert task_cpus.remote_args() == {"num_cpus": 0.25} == task_cpus.map_args()
    finally:
        task_cpus._task_cpus = None
