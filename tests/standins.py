"""Stand-ins for tests of an agent off any fabric: a reader with no pulses, an agent built around it, a free
TCP port on the loopback."""
from __future__ import annotations

import socket
from pathlib import Path

from agent.daemon import AgentOptions, SwitchAgent
from agent.deployment import Deployment
from agent.detector import DetectorConfig
from netns_testbed.topo import Fabric, SprayMode


class IdleReader:
    """A reader of a switch no pulse ever crosses."""

    resyncs = lost = 0

    def poll(self):
        return None

    def close(self):
        pass


def idle_agent(directory: Path, fabric: Fabric, switch: str, record: Path | None = None,
               verdict_key: bytes | None = None) -> SwitchAgent:
    """``switch``'s agent with an IdleReader, its state and verdicts under ``directory``."""
    dep = Deployment(name="t", fabric=fabric, spray=SprayMode.RRDST, weights={}, out_of_service=(), degraded=(),
                     state_dir=directory / "state", verdict_dir=directory / "verdicts", reload=lambda: dep,
                     verdict_key=verdict_key)
    return SwitchAgent(dep, switch, AgentOptions(cfg=DetectorConfig(), record=record), IdleReader())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
