"""``flowpulse agent``: the per-switch FlowPulse detector as a long-running daemon."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

from agent.detector.config import DetectorConfig, Model
from agent.mitigation import CANARY_WEIGHT
from agent.privileges import SITE_AGENT_EBPF, SITE_AGENT_NETLINK, TESTBED_AGENT
from flowpulse.argtypes import PER_SECOND, SECONDS, choice, number
from flowpulse.cmdbase import Formatter, add_common

log = logging.getLogger("flowpulse.agent")


def add_detector_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=choice(Model), choices=list(Model), default=Model.ANALYTIC,
                   help="expected spray shares from the fabric model (analytic, judges from the first pulse) "
                        "or measured in the first pulses and checked against it (learned)")
    p.add_argument("--fa-per-day", type=PER_SECOND, default=1.0,
                   help="false-alert budget: false alerts per day for the whole fabric")
    p.add_argument("--pulse-hz", type=PER_SECOND, default=1.0,
                   help="pulses (training iterations) per second per switch, for the budget")
    p.add_argument("--min-rate", type=number(0, 1, above=True, below=True), default=DetectorConfig.min_rate, help="do not raise alarms whose estimated rate is below this")
    p.add_argument("--degraded", action="append", default=[], metavar="LINK",
                   help="a link known to be lossy: excluded from the tests (repeatable)")


def detector_config(args: argparse.Namespace):
    return DetectorConfig(model=args.model, fa_per_day=args.fa_per_day, pulse_hz=args.pulse_hz,
                          min_rate=args.min_rate).validate()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent", help="run the FlowPulse detector on one switch or all", formatter_class=Formatter,
        epilog="examples:\n  sudo flowpulse agent --switch leaf2\n"
               "  sudo flowpulse agent --all --alerts alerts.jsonl --metrics-port 9580\n"
               "  sudo flowpulse agent --all --live\n"
               "  sudo flowpulse agent --all --incidents incidents.jsonl --json\n"
               "  sudo flowpulse agent --all --mitigate --incidents incidents.jsonl --metrics-port 9580\n"
               "  sudo flowpulse agent --all --mitigate --canary-weight 0.5    # name a lossy suspect sooner\n"
               "  sudo flowpulse agent --site /etc/flowpulse/site.yaml --alerts /var/log/flowpulse/alerts.jsonl\n"
               "  sudo flowpulse agent --site /etc/flowpulse/site.yaml --metrics-port 9580 --metrics-addr 0.0.0.0 \\\n"
               "      --web-config /etc/flowpulse/web.yml     # TLS and basic auth, as node_exporter's\n"
               "With --site the agent runs on any Linux machine that forwards the fabric's traffic: it\n"
               "attaches a counting-only program to the site's interfaces (no spraying, no faults), reads\n"
               "nothing of a testbed, and detaches on exit (SIGTERM: exit 143, SIGINT: 130). See agent/site.py.\n"
               "Send SIGHUP to accept the fabric's current state (e.g. a link taken out of service): the\n"
               "detectors then relearn. Each switch's detector uses only its own counters; a leaf's alert\n"
               "that points at two links is settled by the verdict of the other link's owner (exported by\n"
               "its agent under the testbed's state directory), and one incident per fault names the link.")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--switch", action="append", default=[], help="switch to watch (repeatable)")
    who.add_argument("--all", action="store_true", help="every switch of the testbed")
    who.add_argument("--site", type=Path, metavar="FILE",
                     help="the switch this machine is, from a site file (YAML); not a testbed")
    p.add_argument("--state-dir", type=Path, help="with --site: where detector state goes (overrides the site file)")
    p.add_argument("--verdict-dir", type=Path, help="with --site: the directory the fabric's agents share for "
                                                    "verdicts (overrides the site file)")
    add_detector_args(p)
    p.add_argument("--alerts", type=Path, help="append JSON-lines alert events to this file")
    p.add_argument("--incidents", type=Path, help="append JSON-lines incident events (one incident per fault, "
                                                  "naming the link) to this file")
    p.add_argument("--record", type=Path, help="directory to record every pulse (pulses-<switch>.jsonl) for replay")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address for the metrics endpoint")
    p.add_argument("--web-config", type=Path, metavar="FILE",
                   help="TLS and basic auth of the metrics endpoint (the Prometheus exporters' web config format: "
                        "tls_server_config, basic_auth_users; see agent/webconfig.py)")
    p.add_argument("--mitigate", action="store_true",
                   help="with --all on a testbed: drain the link an incident names, hold a suspect uplink at a "
                        "canary share while its incident is localizing (agent/mitigation.py)")
    p.add_argument("--max-drained-per-switch", type=int, default=2,
                   help="with --mitigate: links drained by the policy that may touch one switch")
    p.add_argument("--min-spines", type=int, default=1,
                   help="with --mitigate: spines every leaf keeps towards every other leaf, whatever is drained")
    p.add_argument("--canary-weight", type=number(0.01, 1), default=CANARY_WEIGHT, metavar="W",
                   help="with --mitigate: a suspect uplink's spray weight while its incident is localizing, 0.01-1 "
                        "(1: no canary; larger names a lossy suspect sooner and shields the job less)")
    p.add_argument("--live", action="store_true", help="full-screen live view in the terminal")
    p.add_argument("--duration", type=SECONDS, default=None, help="stop after this many seconds")
    p.add_argument("--poll-ms", type=number(1, 1000), default=10.0,
                   help="how often to sample the counters when they cannot wake the agent (netlink; a testbed built "
                        "without the pulse ring); the eBPF counters wake it when a pulse opens")
    add_common(p)
    p.set_defaults(func=cmd_agent)


def check_output_file(flag: str, path: Path | None) -> None:
    """An output file the agent appends to: its directory must exist and it must not be a directory."""
    from flowpulse.errors import SpecError

    if path is None:
        return
    if path.is_dir():
        raise SpecError(f"{flag} {path}: is a directory; name a file in it, e.g. {path / 'out.jsonl'}")
    if not path.parent.is_dir():
        raise SpecError(f"{flag} {path}: directory {path.parent} does not exist; create it or name another file")


def check_port_free(addr: str, port: int) -> None:
    """The metrics endpoint's address must be bindable now (before anything is opened or written)."""
    import socket

    from flowpulse.errors import EnvironmentProblem, SpecError

    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SpecError(f"bad --metrics-addr {addr!r}: {e.strerror}; give an IP address such as 127.0.0.1") from None
    fam, _, _, _, sockaddr = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as sk:
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sk.bind(sockaddr)
        except OSError as e:
            raise EnvironmentProblem(f"cannot serve metrics on {addr}:{port}: {e.strerror}; "
                                     "pick another --metrics-port or --metrics-addr") from None


def check_agent_args(args: argparse.Namespace) -> None:
    """Everything the agent is told, checked before it touches the testbed: one line, exit 2 (numbers are
    checked by their argparse types, flowpulse/argtypes.py)."""
    from flowpulse.errors import SpecError

    for flag, path in (("--alerts", args.alerts), ("--incidents", args.incidents)):
        check_output_file(flag, path)
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise SpecError(f"bad --metrics-port {args.metrics_port}: a TCP port in 1-65535")
    args.web = None
    if args.web_config is not None:
        if args.metrics_port is None:
            raise SpecError("--web-config goes with --metrics-port (it secures the metrics endpoint)")
        from agent.webconfig import load_web_config

        args.web = load_web_config(args.web_config)
    dup = sorted({s for s in args.switch if args.switch.count(s) > 1})
    if dup:
        raise SpecError(f"--switch {dup[0]} given twice: name each switch once")
    if not args.site:
        for flag, value in (("--state-dir", args.state_dir), ("--verdict-dir", args.verdict_dir)):
            if value is not None:
                raise SpecError(f"{flag} goes with --site: a testbed's agents keep state in its state directory")
    elif args.degraded:
        raise SpecError("--degraded goes with a testbed; with --site list the links under degraded: in the site file")
    if args.mitigate and not args.all:
        raise SpecError("--mitigate goes with --all on a testbed (one process sees every incident); on a real "
                        "fabric route the FlowPulseLinkDrained alert to your routing (flowpulse nexthop-hook)")
    args.mitigation_policy = None     # parsed once here; serve_agents hands it to the Mitigator
    if args.mitigate:
        from agent.mitigation import MitigationPolicy

        args.mitigation_policy = MitigationPolicy(max_per_switch=args.max_drained_per_switch,
                                                  min_spines=args.min_spines,
                                                  canary_weight=args.canary_weight).validate()


def load_site_args(args: argparse.Namespace):
    """The site file, with --state-dir / --verdict-dir applied."""
    from dataclasses import replace

    from agent.site import load_site

    site = load_site(args.site)
    if args.state_dir is not None:
        site = replace(site, state_dir=args.state_dir.resolve(), pinned=site.pinned + ("state_dir",))
    if args.verdict_dir is not None:
        site = replace(site, verdict_dir=args.verdict_dir.resolve(), pinned=site.pinned + ("verdict_dir",))
    return site


def cmd_agent(args: argparse.Namespace) -> int:
    from agent.daemon import AgentOptions, JsonLinesSink, SwitchAgent
    from netns_testbed.nsutil import require_root

    check_agent_args(args)
    cfg = detector_config(args)          # the detector's settings too (--fa-per-day, --pulse-hz)
    site = load_site_args(args) if args.site else None
    ifindexes = None
    if site is not None:
        from agent.counting import local_ifindexes

        ifindexes = local_ifindexes(site)   # every interface exists here, before anything is built or written
    require_root()
    if site is not None:
        from netns_testbed.safefiles import writable_dir

        writable_dir(site.state_dir, "state_dir")      # before anything is attached (exit 3)
        writable_dir(site.verdicts, "verdict_dir")
        if site.verdict_key is not None:
            from agent.verdictauth import load_key

            load_key(site.verdict_key)                      # exit 3 if it is missing or others can read it
        else:
            log.warning("site %s names no verdict_key: verdicts are neither signed nor checked (anyone who "
                        "can write to %s, or answer for a peer, can sway a verdict)", args.site, site.verdicts)
        site.peer_access()                                  # its password file readable (exit 2)
        if site.peers and args.metrics_port is None:
            log.warning("site %s names peers, but without --metrics-port this agent serves them no verdicts "
                        "(/verdicts/%s)", args.site, site.switch)
    if args.metrics_port is not None:
        check_port_free(args.metrics_addr, args.metrics_port)
    sink = JsonLinesSink(args.alerts, stdout=args.json)
    if site is not None:
        return run_site_agent(args, site, ifindexes, cfg, sink)
    from netns_testbed.state import Testbed

    tb = Testbed.load(args.prefix)
    switches = tb.fabric.switches if args.all else args.switch
    tb.fabric.parse_link_list(args.degraded)
    opts = AgentOptions(cfg=cfg, alerts=args.alerts, record=args.record, poll_s=args.poll_ms / 1000,
                        export_verdicts=set(switches) != set(tb.fabric.switches))
    agents = [SwitchAgent.on_testbed(tb, sw, opts, sinks=[sink], degraded=args.degraded) for sw in switches]
    return serve_agents(args, agents, sink, f"testbed {tb.prefix} (spray {tb.state.spray})", piddir=tb.dir / "pids",
                        keep=TESTBED_AGENT)


def run_site_agent(args: argparse.Namespace, site, ifindexes: list[int], cfg, sink) -> int:
    """The agent of the one switch a site file describes, on this machine's interfaces."""
    from agent.counting import CountingProgram
    from agent.daemon import AgentOptions, SwitchAgent
    from agent.reader import PulseReader
    from agent.site import CounterSource

    opts = AgentOptions(cfg=cfg, alerts=args.alerts, record=args.record, poll_s=args.poll_ms / 1000,
                        export_verdicts=True)
    how = {CounterSource.EBPF: "ebpf counters: the built object, loaded with libbpf",
           CounterSource.EBPF_BCC: "ebpf counters: compiled here with BCC"}.get(site.counters, f"{site.counters} counters")
    where = f"site {args.site} ({len(site.ifnames)} ports: {', '.join(site.ifnames)}; {how})"
    if site.counters is CounterSource.NETLINK:
        from agent.netlink import NetlinkReader

        reader = NetlinkReader(site.switch, ifindexes, site.fabric.spec.leaves + 2, site.gap_ms)
        try:
            agent = SwitchAgent(site.deployment(), site.switch, opts, reader, sinks=[sink])
        except BaseException:
            reader.close()
            raise
        return serve_agents(args, [agent], sink, where, piddir=None, keep=SITE_AGENT_NETLINK)
    program = CountingProgram(site, ifindexes)
    try:
        program.load()
        program.attach()
        agent = SwitchAgent(site.deployment(), site.switch, opts,
                            PulseReader(site.switch, site.gap_ms, program.maps, armed_ns=program.armed_ns),
                            sinks=[sink])
    except BaseException:
        program.close()
        raise
    try:
        return serve_agents(args, [agent], sink, where, piddir=None, keep=SITE_AGENT_EBPF)
    finally:
        program.close()


def serve_agents(args: argparse.Namespace, agents, sink, where: str, piddir: Path | None,
                 keep: tuple[str, ...]) -> int:
    """Run built agents until --duration, SIGINT or SIGTERM; close everything they opened. Exit 0 at the
    end of --duration, 143 after SIGTERM and 130 after SIGINT (each once everything is closed). Before
    any thread starts, the process keeps only the capabilities ``keep`` (see agent/privileges.py)."""
    import contextlib
    import signal

    from agent.daemon import JsonLinesSink, SignalEvent, make_tracker, run_agents
    from agent.privileges import keep_only

    tracker = make_tracker(agents, reporter=f"agent-{os.getpid()}")
    mitigator = None
    policy = getattr(args, "mitigation_policy", None)
    if policy is not None:
        from agent.mitigation import Mitigator, TestbedActuator

        mitigator = Mitigator(agents[0].dep.fabric, TestbedActuator(args.prefix), policy)
    inc_sink = JsonLinesSink(args.incidents, stdout=args.json)
    pidfile = None
    if piddir is not None:
        from netns_testbed import pidfile as pidfiles

        piddir.mkdir(mode=0o700, exist_ok=True)
        pidfile = piddir / f"agent-{os.getpid()}.pid"
        pidfile.unlink(missing_ok=True)          # a file of a dead process that had this pid
        pidfiles.write(pidfile, " ".join(a.switch for a in agents))
    stop = SignalEvent()
    stopped_by: list[int] = []

    def on_term(signum, frame) -> None:
        stopped_by.append(128 + signum)
        stop.set_from_signal()     # not stop.set(): the main thread may hold its lock (see SignalEvent)

    signal.signal(signal.SIGTERM, on_term)
    keep_only(keep)          # the counters are open: from here on only what reading them needs
    code = 0
    try:
        if args.metrics_port is not None:
            from agent.metrics import serve

            web = getattr(args, "web", None)
            serve(agents, args.metrics_port, args.metrics_addr, tracker, mitigator, web)
            log.info("metrics on %s://%s:%d/metrics, health on /healthz%s", "https" if web and web.tls else "http",
                     args.metrics_addr, args.metrics_port, " (basic auth)" if web and web.users else "")
        if args.duration:
            timer = threading.Timer(args.duration, stop.set)
            timer.daemon = True
            timer.start()
        log.info("watching %s on %s, model %s", ", ".join(a.switch for a in agents), where, args.model)
        if args.live:
            from agent.liveview import LiveScreen

            screen = LiveScreen(tracker)
        else:
            screen = contextlib.nullcontext()
        with screen:
            run_agents(agents, stop, agents[0].opts.poll_s, on_tick=screen.update if args.live else None,
                       tick_s=0.5, tracker=tracker, incident_sinks=[inc_sink], mitigator=mitigator)
    except KeyboardInterrupt:
        code = 130
    except RuntimeError as e:  # maps gone: the testbed went down under us
        print(f"flowpulse: agent stopped: {e}", file=sys.stderr)
        code = 4
    finally:
        stop.set()
        for a in agents:
            a.close()
        sink.close()
        inc_sink.close()
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)
    return stopped_by[0] if stopped_by and code == 0 else code
