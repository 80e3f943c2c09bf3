"""`python -m benchmarks launch --pool a.json b.json ...`: the launch table from several runs'
rounds taken together, computed as one run computes its own (no GPU needed)."""
from __future__ import annotations

import json
import statistics

from benchmarks import __main__ as bench
from benchmarks.launch import pooled

FLOOR = "C cuLaunchKernel"
BOUND = "kjit bound launcher L(...)"
TORCH = "kjit k[g, b, torch stream](torch tensor, ...)"


def _run(path, bound, torch, note="one C call built against this PyTorch"):
    """A run's JSON as benchmarks/__main__.py writes it: per row and argument count, the
    rounds' (toolkit µs, C µs beside it); the torch row's C ran on its stream."""
    launch = {FLOOR: {}, BOUND: {"1": {"ratio": 0}}, TORCH: {"1": {"ratio": 0, "c_stream_us": 0}},
              "torch tensors read through": note}
    path.write_text(json.dumps({"machine": {"gpu": ["H100"], "date": "2026-11-27", "driver": "13.0",
                                            "nvrtc": "13.0", "cuda_bindings": "13", "python": "3.12"},
                                "launch": launch,
                                "launch_rounds": {BOUND: {"1": bound}, TORCH: {"1": torch}}}))
    return str(path)


def test_pooled_rounds_give_the_median_of_every_round(tmp_path, capsys):
    a = _run(tmp_path / "a.json", [[1.02, 1.0], [3.09, 3.0]], [[5.5, 5.0], [4.4, 4.0]])
    b = _run(tmp_path / "b.json", [[2.1, 2.0]], [[6.3, 6.0]])
    data, rounds = pooled([a, b])
    bound, torch = data[BOUND]["1"], data[TORCH]["1"]
    assert bound["ratio"] == round(statistics.median([1.02, 1.03, 1.05]), 3) == 1.03
    assert (bound["min"], bound["max"]) == (1.02, 1.05)
    assert len(rounds[BOUND]["1"]) == 3
    # C's figure for the floor row comes from the rows on the legacy stream only; a streamed
    # row keeps C's own figure on its stream
    assert data[FLOOR]["1"]["us"] == 2.0
    assert torch["c_stream_us"] == 5.0 and torch["ratio"] == 1.1
    assert data["torch tensors read through"] == "one C call built against this PyTorch"
    out = tmp_path / "pooled.json"
    assert bench.main(["launch", "--pool", a, b, "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["machine"]["pooled"] == [a, b]
    assert written["launch"][BOUND]["1"]["ratio"] == 1.03
    assert written["targets"]["kjit bound launcher L(...) 1 args <= 1.03x C (median)"] is True
    assert "kjit bound launcher" in capsys.readouterr().out
