// Structures shared by switch.c, count.c and their Python loaders. datapath.py mirrors them
// with ctypes; every constant, struct size and field offset it relies on is
// compiled into the program as a _Static_assert (netns_testbed/contract.py), so
// a drift fails the load and names the fact.
#ifndef FLOWPULSE_SWITCH_H
#define FLOWPULSE_SWITCH_H

#define FP_DIR_IN 0
#define FP_DIR_OUT 1
#define FP_HOOK_INGRESS 0
#define FP_HOOK_EGRESS 1

// Packet kinds counted separately.
#define FP_KIND_TCP_DATA 0   // TCP with payload
#define FP_KIND_TCP_CTRL 1   // TCP without payload (ACK, SYN, FIN)
#define FP_KIND_OTHER 2      // other IPv4
#define FP_KIND_NONIP 3      // not IPv4 (ARP, IPv6)
#define FP_KIND_BADHDR 4     // IPv4 with a broken header checksum (discarded)
#define FP_NKIND 5

#define FP_SPRAY_OFF 0       // plain kernel routing (ECMP)
#define FP_SPRAY_RANDOM 1
#define FP_SPRAY_RR 2
#define FP_SPRAY_RRDST 3
#define FP_SPRAY_SLOTS 256
// ifindex_port is indexed by the port's interface index in the switch's namespace (the namespace
// numbers its own interfaces from 1, lo first): value port + 1, 0 for an interface that is no port.
#define FP_IFINDEX_SLOTS 1024

#define FP_FAULT_NONE 0
#define FP_FAULT_DROP 1
#define FP_FAULT_CORRUPT 2

#define FP_PROB_ONE (1ULL << 32)
#define FP_ALL 0xffffffffU

#define FP_PULSE_TIME_BITS 40
#define FP_PULSE_UNIT_SHIFT 20   // pulse times and the idle gap in units of 2^20 ns
#define FP_PULSE_TIME_MASK ((1ULL << FP_PULSE_TIME_BITS) - 1)

struct fp_counter {
    u64 pkts;
    u64 bytes;
};

// Per-pulse counters live in a ring of FP_RING slots (a -D parameter, a power of
// two): pulse id P counts into slot P % FP_RING. Each per-CPU element carries the
// id of the pulse it holds; the first packet of a new pulse to touch an element
// finds an older id there and starts it from zero. A reader sums, per element
// and CPU, only the values tagged with the pulse it reads, so a late reader
// loses nothing until FP_RING pulses have passed, and pulses never merge.
// One element per (port, direction, source class) holds the packets of each
// kind (bytes are in the cumulative totals only): 24 bytes per CPU, what a
// reader copies per element each pulse.
struct fp_count {
    u32 pulse;              // the (24-bit) pulse id these counts belong to
    u32 pkts[FP_NKIND];     // packets of each kind in that pulse
};

// D-SACKs seen in one pulse on one (port, direction).
struct fp_dup {
    u64 pulse;
    u64 segs;        // segments carrying a D-SACK
    u64 bytes;       // sequence bytes their blocks report
};

// One per ring slot: when the pulse in it started and ended (ns, the end is the
// last IPv4 packet's time unit, written when the next pulse opens; 0 while open).
struct fp_pulse_rec {
    u64 pulse;
    u64 start_ns;
    u64 end_ns;
};

struct fp_config {
    u32 mode;        // FP_SPRAY_*
    u32 gap_units;   // idle gap that ends a pulse, in units of 2^20 ns
    u32 leaf_class;  // this leaf's source class (leaf number + 1); 0 on a spine
    u32 nuplinks;    // a leaf's uplinks are ports 0..nuplinks-1; 0 on a spine
    u32 nhosts;      // a leaf's hosts: host j (10.(L+1).j.2) is behind port nuplinks + j; 0 on a spine
    u32 sink;        // ifindex of the namespace's sink (a down interface that is no port): where an
                     // injected drop goes (switch.c, fault_drop); 0: none, the program drops itself
};

// Where a port's packets go when the program sends them itself (a leaf's spray, or a destination
// the address plan names: switch.c's fp_ingress): the port's
// interface, and the neighbour's IPv4 address on that link (network byte order), handed to
// bpf_redirect_neigh so that the kernel resolves the neighbour without a route lookup of its own.
struct fp_port {
    u32 ifindex;
    u32 nh4;         // 0: none known (the kernel then looks the route up)
};

// A leaf's spray table towards one destination leaf. Two banks of them: a change (a drain, a
// restore: netns_testbed/drain.py) fills the bank not in use, then flips spray_bank, so that a packet
// sees either every table of the old state or every table of the new one, never a mix.
struct fp_spray {
    u32 len;                     // used slots
    u8 slot[FP_SPRAY_SLOTS];     // uplink port per slot (weights = repetitions)
};

struct fp_fault {
    u32 kind;        // FP_FAULT_*
    u32 match_ip;    // 1: only packets matching src/dst nets
    u64 prob;        // hit if a 32-bit random number < prob; FP_PROB_ONE = always
    u32 src_net, src_mask, dst_net, dst_mask;  // network byte order
    u32 flow_frac;   // only flows whose hash < flow_frac; FP_ALL = all flows
    u32 pad;
    u64 period_ns;   // flapping: 0 = always on, else on for on_ns of each period
    u64 on_ns;
    u64 t0_ns;
};

// Source classes of a site (count.c): IPv4 prefix -> source leaf + 1, longest match.
#define FP_MAX_PREFIXES 1024
struct fp_prefix_key {
    u32 prefixlen;   // leading bits of addr that must match (the LPM trie's key)
    u32 addr;        // network byte order
};

// The owner's same-packet reference (switch.c, ingress of fabric ports): per TCP flow and port the
// highest sequence end seen there. The flow's packets are sprayed over the spines, so the segments
// one port carries are a share of the flow's, and each advance of the highest end on that port
// spans the bytes the flow sent over every spine since the port's previous segment. Per pulse and
// (port, remote leaf) the program adds the spans and the new bytes the port's own segments carried:
// new bytes = spray share x span on a healthy link, whatever the workload, the pulse's timing or
// the retransmissions (a segment below the highest end sent after the one that moved it there is a
// retransmission and counts apart). A loss on the link into the port takes segments out of the new bytes and nothing out of
// the span: the next segment that arrives spans the lost one too.
// A segment that comes in below the highest end may be the port's own, overtaken on the way (two
// CPUs forwarding one flow: each hop's per-CPU backlogs reorder a burst by several segments), or a
// retransmission. Its bytes are new here in the first case (the advance that overtook it already
// spanned them) and not in the second; counted as resent, every overtaken segment reads as a loss
// on this link (live, 4x4x2 rings: bursts of 25-30 per port and pulse, 1% of a port's segments, at
// every spine alike). The sender tells them apart: Linux numbers every IPv4 packet of a connection
// (the IP ID, per socket, retransmissions included), so a segment below the end sent *before* the
// one that moved the end there (an older ID, 16-bit serial arithmetic) is an overtaken first
// transmission, and one sent after it is resent. A sender whose IDs do not move (some stacks send 0
// with DF) falls back to the last advance: below the highest end but inside its last advance is
// overtaken, below that is resent. Below an end the flow's ACK set, everything is resent.
// The remote leaf is the packet's destination leaf at a spine (its ingress port is the source
// leaf), the source leaf at a leaf (its uplink is the spine).
// At a spine the flow's ACKs move the same end (switch.c, track_ack): a pure ACK from leaf M to leaf
// A goes out of the port its data comes in on, and an acknowledgement beyond the highest end there
// spans bytes the receiver has, whichever spine they crossed. A fault on leafA->spineK that takes
// every segment of some flows (a flow-selective blackhole) leaves those flows no segment on the port
// to move the end; their ACKs go the other way (leafM->spineK->leafA, links the fault does not
// touch), a share of them through spine K, each carrying the whole acknowledgement, and the flows'
// spans grow with no new bytes. A leaf has no such view: the ACKs of the data it receives leave by
// its uplinks, and the reference is kept where data comes in.
#define FP_FLOWS 8192            // flows tracked per switch (LRU: the least recent is evicted)
#define FP_SPAN_LIMIT (1U << 24) // an advance beyond this is no flow's window: the flow starts over

struct fp_flow_key {
    u32 saddr, daddr;  // network byte order
    u32 ports;         // source << 16 | destination port, each as the header holds it
    u32 port;          // the switch port the segments came in on
};

struct fp_flow {
    u32 end;           // highest sequence end seen on this port (host order)
    u32 prev;          // what it was before its last advance
    u16 id;            // IPv4 ID of the segment that moved the end there (0 when an ACK did)
    u16 by_ack;        // 1: the flow's ACK moved the end last (no segment's ID to compare with)
};

struct fp_span {
    u32 pulse;         // the (24-bit) pulse id these sums belong to
    u32 first;         // segments with new data: beyond the highest end, or overtaken (sent before the one that moved it)
    u32 resent;        // data segments below the highest end sent after the one that moved it (retransmissions)
    u32 pad;
    u64 new_bytes;     // their bytes: beyond the highest end, or the whole of a late one
    u64 span;          // sequence bytes the highest end moved by
};

struct fp_fault_stats {
    u64 matched;     // packets on the link matching src/dst (whether hit or not)
    u64 hit;         // of those, dropped or corrupted
};

#endif
