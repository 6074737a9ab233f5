"""Experiment specifications: from YAML or flags, validated before anything is built.

A YAML spec mirrors the flags::

    fabric: {leaves: 4, spines: 4, hosts_per_leaf: 2}
    spray: rrdst
    workload: {kind: allreduce, size: 4MiB, iterations: 30, idle_ms: 300}
    out_of_service: ["leaf0<->spine3"]
    faults: ["leaf1->spine2:drop=0.01@iter=10", "spine0->leaf3:corrupt=0.015@t=12.5"]
    detector: {model: analytic, fa_per_day: 1}
    seed: 1
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from agent.detector import DetectorConfig
from agent.mitigation import MitigationPolicy
from netns_testbed import untrusted
from netns_testbed.errors import SpecError
from netns_testbed.faults import Backend, FaultSpec, check_backend, parse_fault
from netns_testbed.builder import UpOptions
from netns_testbed.topo import Fabric, FabricSpec, SprayMode, check_prefix
from workload.launcher import JobSpec, parse_size


@dataclass(frozen=True)
class ScheduledFault:
    """A fault and when it starts: before iteration ``iter`` or ``t`` seconds after the job starts."""

    fault: FaultSpec
    at_iter: int | None = None
    at_t: float | None = None
    text: str = ""

    def describe(self) -> str:
        when = f"before iteration {self.at_iter}" if self.at_iter is not None else f"at t={self.at_t:g} s"
        return f"{self.fault.describe()} {when}"


def parse_scheduled(fabric: Fabric, text: str) -> ScheduledFault:
    """``LINK:KIND[=RATE][,MODS][@iter=K|@t=S]``; no ``@`` means from the first iteration."""
    body, at, when = (text or "").partition("@")
    fault = parse_fault(fabric, body)
    if not at:
        return ScheduledFault(fault, at_iter=0, text=text)
    key, _, value = when.partition("=")
    try:
        if key == "iter":
            k = int(value)
            if k < 0:
                raise ValueError
            return ScheduledFault(fault, at_iter=k, text=text)
        if key == "t":
            t = float(value)
            if not 0 <= t < math.inf:
                raise ValueError
            return ScheduledFault(fault, at_t=t, text=text)
    except ValueError:
        pass
    raise SpecError(f"bad fault start {when!r} in {text!r}: write @iter=K (K >= 0) or @t=SECONDS")


@dataclass
class ExperimentSpec:
    fabric: FabricSpec = field(default_factory=FabricSpec)
    spray: SprayMode = SprayMode.RRDST
    gap_ms: float = 50.0
    job: JobSpec = field(default_factory=JobSpec)
    out_of_service: list[str] = field(default_factory=list)
    faults: list[ScheduledFault] = field(default_factory=list)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    seed: int = 0
    prefix: str = "fpx"
    fault_backend: Backend = Backend.BPF
    mitigation: MitigationPolicy | None = None     # None: the agents only report (agent.mitigation)

    def validate(self) -> "ExperimentSpec":
        """Every check that can be made before building anything."""
        check_prefix(self.prefix)
        fabric = Fabric(self.fabric)
        self.up_options().validate(fabric)  # the builder's own checks: spray mode, gap, routable links
        oos = {l.name for l in fabric.parse_link_list(self.out_of_service)}
        seen: dict[str, str] = {}
        for sf in self.faults:
            link = sf.fault.link.name
            if link in seen:
                raise SpecError(f"conflicting faults on {link}: {seen[link]!r} and {sf.text!r}; one fault per link")
            seen[link] = sf.text
            check_backend(sf.fault, self.fault_backend)
            if link in oos:
                raise SpecError(f"fault on {link} which is out of service (it carries no traffic): pick another link")
            if sf.at_iter is not None and sf.at_iter >= self.job.iterations:
                raise SpecError(f"fault {sf.text!r} starts at iteration {sf.at_iter} but the job has only "
                                f"{self.job.iterations} (0..{self.job.iterations - 1})")
            if sf.at_t is not None and sf.at_t >= self.job.deadline:
                raise SpecError(f"fault {sf.text!r} starts at t={sf.at_t:g} s, after the job's deadline "
                                f"({self.job.deadline:.0f} s)")
        self.job.validate(fabric)
        self.detector = self.detector.validate()
        if self.mitigation is not None:
            self.mitigation.validate()
        return self

    def up_options(self) -> UpOptions:
        return UpOptions(spray=self.spray, gap_ms=self.gap_ms, out_of_service=self.out_of_service)

    def to_dict(self) -> dict:
        return {"fabric": self.fabric.to_dict(), "spray": self.spray.value, "gap_ms": self.gap_ms,
                "workload": asdict(self.job), "out_of_service": self.out_of_service,
                "faults": [f.text for f in self.faults], "detector": self.detector.to_dict(),
                "seed": self.seed, "prefix": self.prefix, "fault_backend": self.fault_backend.value,
                "mitigation": None if self.mitigation is None else asdict(self.mitigation)}


SCHEMA = Path(__file__).with_name("spec.schema.json")


def load_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"spec file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"spec file {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise SpecError(f"spec file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"spec file {path} must hold a mapping (fabric:, workload:, faults:, ...)")
    bad = untrusted.problem(SCHEMA, data)
    if bad is not None:
        raise SpecError(f"spec file {path}: {bad}")
    return data


def typed(value, kind: type, name: str):
    """A spec value as ``kind``: numbers stay numbers (a whole float is an int), strings that spell one
    number are read as it (YAML 1.1 reads 1e-6 as a string); anything else is one line naming the key.
    Floats must be finite."""
    import math

    what = {int: "a whole number", float: "a number", str: "a string"}[kind]
    if kind is str:
        if isinstance(value, str):
            return value
        raise SpecError(f"bad {name} {value!r}: must be {what}")
    if isinstance(value, bool):
        raise SpecError(f"bad {name} {value!r}: must be {what}")
    try:
        num = float(value) if isinstance(value, str) else value
        if not isinstance(num, (int, float)) or not math.isfinite(num):
            raise ValueError
        if kind is int:
            if num != int(num):
                raise ValueError
            return int(num)
        return float(num)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"bad {name} {value!r}: must be {what}") from None


def from_dict(data: dict, prefix: str = "fpx") -> ExperimentSpec:
    """A spec from its parsed form: :data:`SCHEMA` first (one line naming the first problem), then what a
    schema cannot say."""
    if not isinstance(data, dict):
        raise SpecError("a spec is a mapping (fabric:, workload:, faults:, ...)")
    bad = untrusted.problem(SCHEMA, data)
    if bad is not None:
        raise SpecError(f"bad spec: {bad}")
    known = {"fabric", "spray", "gap_ms", "workload", "out_of_service", "faults", "detector", "seed", "prefix",
             "fault_backend", "mitigation"}
    unknown = set(data) - known
    if unknown:
        raise SpecError(f"unknown spec field(s) {sorted(unknown)}: allowed are {sorted(known)}")
    fabric = FabricSpec.from_dict(data.get("fabric") or {})
    w = dict(data.get("workload") or {})
    wk = {"kind": "workload", "size": "size", "iterations": "iterations", "idle_ms": "idle_ms", "ranks": "ranks",
          "placement": "placement", "gloo_timeout_s": "gloo_timeout_s", "deadline_s": "deadline_s"}
    bad = set(w) - set(wk)
    if bad:
        raise SpecError(f"unknown workload field(s) {sorted(bad)}: allowed are {sorted(wk)}")
    job_args = {wk[k]: v for k, v in w.items()}
    if "size" in job_args:
        job_args["size"] = parse_size(job_args["size"])
    for name, kind in (("iterations", int), ("idle_ms", float), ("ranks", int), ("gloo_timeout_s", float),
                       ("deadline_s", float), ("workload", str), ("placement", str)):
        if job_args.get(name) is not None:
            job_args[name] = typed(job_args[name], kind, f"workload.{name}")
    seed = typed(data.get("seed", 0), int, "seed")
    gap_ms = typed(data.get("gap_ms", 50.0), float, "gap_ms")
    spray = SprayMode.parse(typed(data.get("spray", "rrdst"), str, "spray"))
    try:
        job = JobSpec(**job_args, seed=seed)
        det_data = data.get("detector") or {}
        if not isinstance(det_data, dict):
            raise SpecError("detector must be a mapping, e.g. {model: analytic, fa_per_day: 1}")
        det = DetectorConfig.from_dict(det_data)
    except TypeError as e:
        raise SpecError(f"bad spec: {e}") from None
    oos = data.get("out_of_service") or []
    if not isinstance(oos, list) or not all(isinstance(x, str) for x in oos):
        raise SpecError("out_of_service must be a list of links, e.g. ['leaf0<->spine3']")
    backend_text = typed(data.get("fault_backend", "bpf"), str, "fault_backend")
    if backend_text not in {b.value for b in Backend}:
        raise SpecError(f"bad fault_backend {backend_text!r}: choose {' or '.join(b.value for b in Backend)}")
    mit = data.get("mitigation")
    if mit is not None and not isinstance(mit, dict):
        raise SpecError("mitigation must be a mapping ({} for the defaults, or max_per_switch:, min_spines:, "
                        "canary_weight:) or absent")
    policy = None
    if mit is not None:
        kinds = {"max_per_switch": int, "min_spines": int, "canary_weight": float}
        bad = set(mit) - set(kinds)
        if bad:
            raise SpecError(f"unknown mitigation field(s) {sorted(bad)}: allowed are {sorted(kinds)}")
        policy = MitigationPolicy(**{k: typed(v, kinds[k], f"mitigation.{k}") for k, v in mit.items()})
    spec = ExperimentSpec(fabric=fabric, spray=spray, gap_ms=gap_ms, job=job, out_of_service=list(oos), detector=det,
                          seed=seed, prefix=typed(data.get("prefix", prefix), str, "prefix"),
                          fault_backend=Backend(backend_text), mitigation=policy)
    fab = Fabric(fabric)
    if not isinstance(data.get("faults") or [], list):
        raise SpecError("faults must be a list of 'LINK:KIND[=RATE][@iter=K]' strings")
    spec.faults = [parse_scheduled(fab, str(t)) for t in data.get("faults") or []]
    return spec
