"""One torch.distributed rank (gloo), run inside a host namespace by the launcher.

Each iteration is one traffic pulse: the collective (or one DDP training step,
whose gradient buckets are allreduced), then an idle phase. Per iteration the
rank records wall and monotonic timestamps (the monotonic clock is the one the
eBPF datapath stamps pulses with) and its NIC's byte counters, and writes
everything as JSON when done.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import struct
import sys
import time
import traceback
from enum import Enum
from pathlib import Path

from netns_testbed.nsutil import parse_mib

class Workload(str, Enum):
    """What each rank runs: one collective per iteration, or a small DDP training step."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCE_SCATTER = "reduce_scatter"
    DDP = "ddp"

    def __str__(self) -> str:
        return self.value


WORKLOADS = tuple(w.value for w in Workload)


# Ethernet 14 + IPv4 20 + TCP 20 + timestamp option 12: every gloo segment's headers.
TCP_FRAME_OVERHEAD = 66


def nic_counters(ifname: str = "eth0") -> tuple[int, int, int, int]:
    """(rx_bytes, rx_packets, tx_bytes, tx_packets) of the rank's NIC (this namespace's /proc/net/dev)."""
    for line in Path("/proc/self/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == ifname:
            f = rest.split()
            return int(f[0]), int(f[1]), int(f[8]), int(f[9])
    raise RuntimeError(f"no interface {ifname} in this namespace")


def tcp_retrans() -> int:
    """Retransmitted TCP segments of this namespace (one rank per host: this rank's)."""
    return parse_mib(Path("/proc/self/net/snmp").read_text()).get("Tcp", {}).get("RetransSegs", 0)


TCP_INFO_LEN = 232
TCPI_UNACKED = 24          # struct tcp_info (include/uapi/linux/tcp.h): u32 tcpi_unacked (segments in flight)
TCPI_NOTSENT_BYTES = 144   # u32 tcpi_notsent_bytes (data queued, not yet sent; kernel >= 4.6)
TCPI_BYTES_SENT = 200      # u64 tcpi_bytes_sent,
TCPI_BYTES_RETRANS = 208   # then u64 tcpi_bytes_retrans (kernel >= 4.19)
DRAIN_LIMIT_S = 2.0        # longest wait for this rank's send queues to empty after an iteration


def _tcp_infos() -> list[bytes]:
    """tcp_info of every TCP socket of this process."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                out.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN))
        except OSError:
            pass
        finally:
            s.close()
    return out


def tcp_payload_sent() -> tuple[int, int]:
    """(data bytes sent, of which retransmitted) over this process's TCP sockets.

    Read from each socket's tcp_info, so first-transmission payload is exact
    (sent - retransmitted) whatever the size of the retransmitted segments.
    """
    sent = retrans = 0
    for info in _tcp_infos():
        if len(info) >= TCPI_BYTES_RETRANS + 8:
            a, b = struct.unpack_from("=QQ", info, TCPI_BYTES_SENT)
            sent, retrans = sent + a, retrans + b
    return sent, retrans


def wait_send_drained(limit_s: float = DRAIN_LIMIT_S) -> float:
    """Wait until no socket of this rank has data queued or in flight; returns the seconds waited.

    A rank's part of a collective can end while its last sends still sit in a socket queue,
    held back by a retransmission: they then leave during the idle gap, between this
    iteration's snapshot and the next one's, and no iteration counts them (a DDP rank once
    came out 64 KB short: 1,531,456 bytes on the wire instead of 1,553,168, 42,456 of them
    retransmitted). Snapshots taken after the drain attribute every byte to its iteration.
    """
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        busy = False
        for info in _tcp_infos():
            if len(info) >= TCPI_NOTSENT_BYTES + 4:
                (unacked,) = struct.unpack_from("=I", info, TCPI_UNACKED)
                (notsent,) = struct.unpack_from("=I", info, TCPI_NOTSENT_BYTES)
                busy = busy or unacked > 0 or notsent > 0
        if not busy:
            break
        time.sleep(0.002)
    return time.monotonic() - t0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one FlowPulse workload rank (started by `flowpulse workload run`)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="ADDR:PORT of rank 0")
    p.add_argument("--workload", choices=WORKLOADS, default="allreduce")
    p.add_argument("--size", type=int, required=True, help="bytes per collective (float32 tensor)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--idle-ms", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=30.0, help="gloo timeout, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--progress", default=None, help="append a JSON line at each iteration's start and end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result: dict = {"rank": args.rank, "world": args.world, "workload": args.workload, "size": args.size,
                    "iterations": [], "ok": False, "error": None, "host": os.environ.get("FLOWPULSE_HOST")}
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        torch.manual_seed(args.seed + args.rank)
        t_init = time.time()
        dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                                world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
        result["init_s"] = time.time() - t_init
        step = _make_step(args, torch, dist)
        progress = open(args.progress, "a", buffering=1) if args.progress else None
        for i in range(args.iterations):
            if progress:
                progress.write(json.dumps({"i": i, "phase": "start", "t": time.time()}) + "\n")
            rx0, rxp0, tx0, txp0 = nic_counters()
            rt0 = tcp_retrans()
            ps0, pr0 = tcp_payload_sent()
            t0, m0 = time.time(), time.monotonic_ns()
            info = step(i)
            t1, m1 = time.time(), time.monotonic_ns()
            drained_s = wait_send_drained()
            rx1, rxp1, tx1, txp1 = nic_counters()
            rt1 = tcp_retrans()
            ps1, pr1 = tcp_payload_sent()
            result["iterations"].append({
                "index": i, "start": t0, "end": t1, "mono_start_ns": m0, "mono_end_ns": m1,
                "tx_bytes": tx1 - tx0, "rx_bytes": rx1 - rx0, "tx_packets": txp1 - txp0, "rx_packets": rxp1 - rxp0,
                # TCP payload on the wire (headers of every frame taken off): comparable with 2(N-1)/N x S
                "tx_payload": (tx1 - tx0) - TCP_FRAME_OVERHEAD * (txp1 - txp0), "retrans_segs": rt1 - rt0,
                # TCP payload sent once (retransmitted bytes taken off), from tcp_info
                "first_tx_payload": (ps1 - ps0) - (pr1 - pr0), "retrans_bytes": pr1 - pr0, **info})
            if progress:
                progress.write(json.dumps({"i": i, "phase": "end", "t": time.time()}) + "\n")
            time.sleep(max(0.0, args.idle_ms / 1000.0 - drained_s))
        result["ok"] = all(it.get("correct", True) for it in result["iterations"])
        if not result["ok"]:
            result["error"] = "wrong collective result"
        dist.destroy_process_group()
    except BaseException as e:  # report, then fail: the launcher names this rank
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        result["traceback"] = traceback.format_exc(limit=5)
    Path(args.out).write_text(json.dumps(result))
    return 0 if result["ok"] else 1


def _make_step(args, torch, dist):
    n = max(1, args.size // 4)
    world, rank = args.world, args.rank
    if args.workload == "allreduce":
        t = torch.empty(n, dtype=torch.float32)
        expect = world * (world + 1) / 2

        def step(i):
            t.fill_(rank + 1)
            dist.all_reduce(t)
            return {"correct": bool(torch.all(t == expect))}
        return step
    if args.workload == "allgather":
        per = max(1, n // world)
        t = torch.empty(per, dtype=torch.float32)
        outs = [torch.empty(per, dtype=torch.float32) for _ in range(world)]

        def step(i):
            t.fill_(rank + 1)
            dist.all_gather(outs, t)
            return {"correct": all(bool(torch.all(o == r + 1)) for r, o in enumerate(outs))}
        return step
    if args.workload == "reduce_scatter":
        per = max(1, n // world)
        ins = [torch.empty(per, dtype=torch.float32) for _ in range(world)]
        out = torch.empty(per, dtype=torch.float32)
        expect = world * (world + 1) / 2

        def step(i):
            for x in ins:
                x.fill_(rank + 1)
            dist.reduce_scatter(out, ins)
            return {"correct": bool(torch.all(out == expect))}
        return step
    return _ddp_step(args, torch, dist, n)


def _ddp_step(args, torch, dist, n_params_target: int):
    """A real small training job: an MLP fit to a fixed random linear teacher with DDP.

    The hidden width is chosen so that the gradient (what DDP allreduces each step)
    is about ``--size`` bytes.
    """
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    d_in, d_out = 64, 8
    hidden = max(8, n_params_target // (d_in + d_out + 2))
    torch.manual_seed(args.seed)  # same teacher and init on every rank
    teacher = torch.randn(d_in, d_out)
    model = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))
    ddp = DDP(model, bucket_cap_mb=max(1, args.size // (4 << 20)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(args.seed * 1000 + args.rank)
    params = sum(p.numel() for p in model.parameters())

    def step(i):
        x = torch.randn(256, d_in, generator=gen)
        y = x @ teacher
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        return {"loss": float(loss.detach()), "params": params}
    return step


if __name__ == "__main__":
    sys.exit(main())
