"""Frees that come while a thread captures a graph wait for the capture to end (cuMemFree
inside a capture would end it). The releases here are Python callables: no GPU needed; the
GPU tests (test_graph_gpu.py, test_capture_gpu.py) free real arrays inside real captures."""
from __future__ import annotations

import threading

from kjit.runtime import capture


def test_a_release_during_a_capture_waits_for_its_end():
    # (kjit.graph() runs the waiting releases once cuStreamEndCapture has ended the capture)
    done = []
    with capture.thread_capture(0, "a test graph"):
        assert capture.capturing_here()
        capture.when_not_capturing(done.append, 1)
        capture.run_waiting()   # still capturing: it waits
        assert done == []
    capture.run_waiting()
    assert done == [1] and capture._waiting == []
    assert not capture.capturing_here()
    capture.when_not_capturing(done.append, 2)   # no capture: at once
    assert done == [1, 2]


def test_another_thread_neither_waits_nor_releases_what_waits_for_this_threads_capture():
    done = []
    with capture.thread_capture(0, "a test graph"):
        capture.when_not_capturing(done.append, "mine")
        worker = threading.Thread(target=capture.when_not_capturing, args=(done.append, "theirs"))
        worker.start()
        worker.join()
        assert done == ["theirs"]   # this thread's wait is still this thread's
    capture.run_waiting()
    assert done == ["theirs", "mine"]


def test_what_waits_for_a_thread_that_ended_is_released_by_another():
    done = []

    def capture_and_end():
        with capture.thread_capture(0, "a test graph"):
            capture.when_not_capturing(done.append, "left behind")
        capture.run_waiting()   # the capture over: released here
        # and one put back as if the thread had ended inside its capture
        with capture._waiting_lock:
            capture._waiting.append((threading.get_ident(), done.append, ("orphan",)))
    worker = threading.Thread(target=capture_and_end)
    worker.start()
    worker.join()
    assert done == ["left behind"]
    capture.run_waiting()
    assert done == ["left behind", "orphan"] and capture._waiting == []
