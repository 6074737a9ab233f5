"""The experiment report's detection scoring against the injected truth (no root, no fabric)."""
from __future__ import annotations

from analysis.scoring import detection_summary

ITS = [{"index": i, "start": 10.0 + i, "end": 10.5 + i} for i in range(6)]


def alert(t: float, pulse_start: float, link: str = "leaf0->spine1") -> dict:
    return {"event": "alert", "time": t, "pulse_start": pulse_start, "switch": "spine1", "port": 0, "link": link,
            "candidates": [link], "kind": "corruption", "estimated_rate": 0.01, "score": 1.0}


def itd(fault_start: float, alerts: list[dict]) -> int | None:
    fault = {"link": "leaf0->spine1", "kind": "corrupt", "rate": 0.015, "start": fault_start, "end": None}
    det = detection_summary([fault], alerts, ITS, [])
    assert det["false_positives"] == 0, det
    return det["per_fault"][0]["iterations_to_detect"]


def test_iterations_to_detect_counts_from_the_first_iteration_under_the_fault():
    assert itd(11.7, [alert(12.6, 12.0)]) == 1       # on in the idle gap before iteration 2, caught in it
    assert itd(11.7, [alert(13.6, 13.0)]) == 2


def test_a_fault_that_reached_the_tail_of_the_iteration_before_is_caught_in_one_not_zero():
    """A fresh clone's run: "@iter=2" switched on 13 ms before iteration 1 ended (rank 0 had ended it, the
    others had not), two frames of iteration 1 were damaged and the corruption test caught them in
    iteration 1's pulse; the report said 0 iterations, as if caught before the fault."""
    assert itd(11.487, [alert(11.493, 11.0)]) == 1
    assert itd(11.487, [alert(12.6, 12.0)]) == 1     # or in the first whole iteration after it


def test_an_alert_before_the_fault_is_a_false_alert():
    fault = {"link": "leaf0->spine1", "kind": "corrupt", "rate": 0.015, "start": 12.0, "end": None}
    det = detection_summary([fault], [alert(11.2, 11.0)], ITS, [])
    assert det["false_positives"] == 1 and not det["per_fault"][0]["detected"], det


def test_iterations_from_detection_to_localization_count_the_iterations_begun_in_between():
    """The issue's measure, live: an incident naming the link before the next iteration begins is 0, one
    that names it during the next iteration is 1. An incident naming another link leaves it unset."""
    fault = {"link": "leaf0->spine1", "kind": "drop", "rate": 0.01, "start": 11.7, "end": None}
    first = alert(12.6, 12.0)                                   # raised in iteration 2 (starts 12.0)

    def lag(named_at: float, link: str = "leaf0->spine1"):
        inc = {"link": link, "candidates": [link], "localized_time": named_at, "how": "named by spine1"}
        return detection_summary([fault], [first], ITS, [inc])["per_fault"][0]["iterations_detect_to_localize"]
    assert lag(12.9) == 0
    assert lag(13.0) == 1 and lag(13.8) == 1                     # iteration 3 began at 13.0
    assert lag(14.2) == 2
    assert lag(12.9, link="spine1->leaf1") is None
