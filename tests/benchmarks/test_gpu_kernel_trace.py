"""The device check's reading of a profiler trace into per-call kernel times."""

from benchmarks.gpu.kernel_trace import kernel_times


def test_kernel_times_per_call_from_device_events_only():
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        # two calls: the kernel twice (10 us each), a merge twice (2 us), overlapping once
        {"ph": "X", "pid": 1, "name": "decode", "ts": 0.0, "dur": 10.0},
        {"ph": "X", "pid": 1, "name": "merge", "ts": 9.0, "dur": 2.0},
        {"ph": "X", "pid": 1, "name": "decode", "ts": 20.0, "dur": 10.0},
        {"ph": "X", "pid": 1, "name": "merge", "ts": 31.0, "dur": 2.0},
        {"ph": "X", "pid": 2, "name": "host work", "ts": 0.0, "dur": 100.0},
    ]
    times = kernel_times(events, calls=2)
    # busy: [0, 11] and [20, 30] and [31, 33] = 23 us over 2 calls
    assert times["device_busy_us_per_call"] == 11.5
    assert times["kernels"] == [
        {"name": "decode", "us_per_call": 10.0, "launches_per_call": 1.0},
        {"name": "merge", "us_per_call": 2.0, "launches_per_call": 1.0},
    ]


def test_kernel_times_none_without_a_device_process():
    events = [{"ph": "X", "pid": 2, "name": "host work", "ts": 0.0, "dur": 1.0}]
    assert kernel_times(events, calls=1) is None
