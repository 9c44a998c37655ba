"""tests/suite_cpu.py reads the kernel's accounting records right and gives each process its lane."""

from .. import suite_cpu

WORKER = "/usr/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))"


def _record(pid, ppid, start, cpu_ticks, comm=b"python", life_ticks=500.0):
    # comp_t of a value under 8192 is the value itself (exponent 0)
    return suite_cpu._ACCT_V3.pack(0, 3, 0, 0, 0, 0, pid, ppid, start, life_ticks, cpu_ticks, 0, 0, 0, 0, 0, 0, 0,
                                   comm.ljust(16, b"\0"))


def test_comp_t_and_records_decode(tmp_path):
    assert suite_cpu._comp_t(0x1FFF) == 8191
    assert suite_cpu._comp_t((1 << 13) | 3) == 24  # mantissa 3, one base-8 exponent
    path = tmp_path / "pacct"
    path.write_bytes(_record(10, 1, 1000, 250, b"ray::IDLE") + _record(11, 10, 1001, 7))
    first, second = suite_cpu._records(path)
    assert first == {"pid": 10, "ppid": 1, "start": 1000.0, "life": 5.0, "cpu": 2.5, "comm": "ray::IDLE"}
    assert second["ppid"] == 10 and second["cpu"] == 0.07


def test_lanes_follow_the_parent_alive_when_the_child_started():
    records = [
        {"pid": 100, "ppid": 1, "start": 0.0, "life": 100.0, "cpu": 1.0, "cmd": "python -m pytest", "comm": "python"},
        {"pid": 101, "ppid": 100, "start": 1.0, "life": 99.0, "cpu": 5.0, "cmd": WORKER, "comm": "python"},
        {"pid": 102, "ppid": 100, "start": 1.0, "life": 99.0, "cpu": 6.0, "cmd": WORKER, "comm": "python"},
        {"pid": 200, "ppid": 101, "start": 10.0, "life": 5.0, "cpu": 2.0, "cmd": "gcs_server", "comm": "gcs_server"},
        {"pid": 201, "ppid": 200, "start": 11.0, "life": 1.0, "cpu": 3.0, "cmd": "ray::Trainer", "comm": "ray::Trainer"},
        # pid 200 reused later by a child of the other lane: its children belong there, not to the first
        {"pid": 200, "ppid": 102, "start": 50.0, "life": 10.0, "cpu": 1.0, "cmd": "rayline run", "comm": "python"},
        {"pid": 300, "ppid": 200, "start": 55.0, "life": 1.0, "cpu": 4.0, "cmd": "ray::IDLE", "comm": "ray::IDLE"},
        {"pid": 400, "ppid": 1, "start": 60.0, "life": 1.0, "cpu": 9.0, "cmd": "raylet", "comm": "raylet"},  # re-parented
    ]
    lane = suite_cpu._lanes(records)
    assert [lane[i] for i in range(len(records))] == [
        "outside the lanes", "lane of xdist worker 101", "lane of xdist worker 102", "lane of xdist worker 101",
        "lane of xdist worker 101", "lane of xdist worker 102", "lane of xdist worker 102", "outside the lanes"]


def test_kinds_name_ray_titles_rayline_commands_and_fall_back_to_comm():
    kind = suite_cpu._kind
    assert kind("ray::ServeReplica:digits:digits-router", "ray::ServeRepli") == "ray::ServeReplica:digits:digits-router"
    assert kind("/usr/bin/python -m rayline.cli cluster up --port=6390", "python") == "rayline cluster up"
    assert kind("/usr/bin/python -m rayline.cli run pipelines/x.yaml --port 1", "python") == "rayline run"
    assert kind("/usr/bin/python /usr/bin/rayline run pipelines/digits-torch.yaml", "python") == "rayline run"
    assert kind("/x/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "gcs_server") == "ray gcs_server"
    assert kind("", "jemalloc_bg_thd") == "[jemalloc_bg_thd]"
    assert kind(WORKER, "python") == "pytest-xdist worker"


def test_names_come_from_the_scan_of_the_same_pid_nearest_in_start_time():
    # acct's and /proc's start times drift apart on a long run; a pid the kernel reused is another process
    records = [{"pid": 7, "start": 1000.0}, {"pid": 7, "start": 5000.0}, {"pid": 8, "start": 1000.0}]
    seen = {7: [(980.0, "ray::ServeController"), (4990.0, "python -m rayline.cli run x.yaml")], "8": [(1500.0, "too far")]}
    suite_cpu._name(records, seen)
    assert [r["cmd"] for r in records] == ["ray::ServeController", "python -m rayline.cli run x.yaml", ""]
