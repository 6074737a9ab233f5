// FlowPulse switch datapath: one instance per switch namespace, attached with
// tcx links (or tc clsact, direct-action) to every port of the switch.
//
//   ingress: fault (host->leaf link faults: hosts run no program)
//            -> count (per port, direction, source leaf, packet kind)
//            -> forward: a leaf sprays packets from a host port to another leaf over its uplinks;
//               a spine, and a leaf towards its own hosts, send a packet to the port its
//               destination address names (the kernel's routing does the rest)
//            -> the owner's reference on fabric ports (per TCP flow: new bytes against the sequence span)
//   egress:  count -> fault (faults on every link out of a switch, after counting)
//
// Compile-time parameters (-D, set by datapath.py from the fabric model): map sizes only, so that
// one compile serves every switch of a shape (a fabric's leaves, its spines):
//   NPORTS   ports of this switch          NLEAVES  leaves in the fabric
//   NSRC     NLEAVES + 2 source classes
//   FP_RING  pulses kept per counter (ring slots, a power of two; see switch.h)
// Which switch runs the program (leaf or spine, leaf number, uplinks) is in its config map.
//
// Maps are pinned by the loader so that the CLI and the agents (other
// processes) read counters and set faults while the programs stay attached.
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#include "switch.h"

#ifndef AF_INET
#define AF_INET 2   // linux/socket.h, which a tc program's headers do not bring in
#endif

// BCC 0.26 declares bpf_redirect_neigh with 3 arguments; the kernel takes 4.
static long (*redirect_neigh4)(u32 ifindex, void *params, int plen, u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

BPF_ARRAY(ifindex_port, u32, FP_IFINDEX_SLOTS);    // this namespace's ifindex -> port + 1 (switch.h)
BPF_ARRAY(port_out, struct fp_port, NPORTS);       // port -> its interface and next hop (redirect target)
BPF_ARRAY(config, struct fp_config, 1);
BPF_ARRAY(spray, struct fp_spray, 2 * NLEAVES);    // [bank * NLEAVES + destination leaf] (switch.h)
BPF_ARRAY(spray_bank, u32, 1);                     // the bank in use: 0 or 1
BPF_PERCPU_ARRAY(rotation, u32, NLEAVES + 1);      // [dst] rrdst, [NLEAVES] rr
BPF_ARRAY(faults, struct fp_fault, NPORTS * 2);    // [port * 2 + hook]
BPF_PERCPU_ARRAY(fault_stats, struct fp_fault_stats, NPORTS * 2);
BPF_PERCPU_ARRAY(spray_stats, u64, NPORTS);        // packets sprayed to each uplink
BPF_TABLE("lru_hash", struct fp_flow_key, struct fp_flow, flows, FP_FLOWS);   // the spans' flows (switch.h)
BPF_PERCPU_ARRAY(spans, struct fp_span, FP_RING * NPORTS * NSRC);   // per pulse [slot][port][remote leaf]

// The testbed's address plan: 10.(L+1).0.0/16 belongs to leaf L.
static __always_inline u32 leaf_class(u32 addr_be) {
    u32 a = bpf_ntohl(addr_be);
    u32 second = (a >> 16) & 0xff;
    if ((a >> 24) == 10 && second >= 1 && second <= NLEAVES)
        return second;
    return 0;
}

#define fp_source_class leaf_class
#define fp_dest_class leaf_class
#include "packet.h"

// FLOWPULSE_SPLICE(counting.inc): the shared maps, pulse_tick(), pulse_now(), count()

// Flow hash for "partial" faults (a fraction of flows); stable per 5-tuple.
// Computed only when such a fault is set.
static __always_inline u32 flow_hash(struct pkt_info *pi) {
    u32 h = pi->saddr * 0x9e3779b1u;
    h ^= pi->daddr + 0x7f4a7c15u + (h << 6) + (h >> 2);
    h ^= pi->ports + pi->proto + 0x165667b1u + (h << 6) + (h >> 2);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    return h;
}

// The per-pulse span sums of (port, remote leaf), emptied when the pulse is a new one.
static __always_inline struct fp_span *span_cell(u32 port, u32 cls, u64 id) {
    u32 idx = ring_slot(id) * NPORTS * NSRC + port * NSRC + cls;
    struct fp_span *sp = spans.lookup(&idx);
    if (sp && sp->pulse != (u32)id) {
        sp->pulse = id;
        sp->first = 0;
        sp->resent = 0;
        sp->new_bytes = 0;
        sp->span = 0;
    }
    return sp;
}

// The owner's same-packet reference (switch.h, struct fp_span): a TCP segment that came in on a
// fabric port moves its flow's highest sequence end on that port, or counts as resent. ``cls`` is
// the remote leaf's class (1..NLEAVES). A flow's first segment on a port, and the first after its
// entry was evicted, only sets the end: neither its bytes nor a span count, so the sums stay paired.
static __always_inline void track_span(struct pkt_info *pi, u32 port, u32 cls, u64 id) {
    struct fp_flow_key key = {.saddr = pi->saddr, .daddr = pi->daddr, .ports = pi->ports, .port = port};
    if (pi->syn_rst) {
        flows.delete(&key);   // a new connection on the same addresses and ports: new sequence space
        return;
    }
    if (pi->kind != FP_KIND_TCP_DATA || pi->payload >= 65536)
        return;
    u32 end = pi->seq + pi->payload;
    struct fp_flow *f = flows.lookup(&key);
    if (!f) {
        struct fp_flow fresh = {.end = end, .prev = end, .id = pi->ip_id};
        flows.update(&key, &fresh);
        return;
    }
    s32 adv = (s32)(end - f->end);
    if (adv > (s32)FP_SPAN_LIMIT || adv < -(s32)FP_SPAN_LIMIT) {
        f->end = end;         // no window moves that far: the flow starts over
        f->prev = end;
        f->id = pi->ip_id;
        f->by_ack = 0;
        return;
    }
    struct fp_span *sp = span_cell(port, cls, id);
    if (!sp)
        return;
    if (adv <= 0) {
        // below the highest end: overtaken (sent before the segment that moved the end) or resent (switch.h)
        s16 age = (s16)(pi->ip_id - f->id);
        int overtaken = f->by_ack ? 0 : age != 0 ? age < 0 : (s32)(pi->seq - f->prev) >= 0;
        if (overtaken && adv < 0) {
            sp->first += 1;
            sp->new_bytes += pi->payload;
        } else {
            sp->resent += 1;
        }
        return;
    }
    f->prev = f->end;
    f->end = end;
    f->id = pi->ip_id;
    f->by_ack = 0;
    sp->first += 1;
    sp->new_bytes += (u32)adv < pi->payload ? (u32)adv : pi->payload;
    sp->span += (u32)adv;
}

// The same reference from the flow's acknowledgements (switch.h): a spine forwards the ACKs of the
// flows whose data comes in on ``port`` (they go out of it), and an ACK beyond the flow's highest
// end there moves the end to it: the receiver has those bytes, so they crossed some spine. A flow
// whose data never reaches this port (a flow-selective blackhole on the link into it) still has its
// ACKs come by: its span grows and its new bytes do not. Only pure ACKs are read (no payload, no
// SYN or RST): a segment with data is its own flow's, and its acknowledgement rides on the ACKs
// that follow. ``cls`` is the data's destination leaf (the ACK's source).
static __always_inline void track_ack(struct pkt_info *pi, u32 port, u32 cls, u64 id) {
    if (pi->kind != FP_KIND_TCP_CTRL || !pi->ack_flag || pi->syn_rst)
        return;
    struct fp_flow_key key = {.saddr = pi->daddr, .daddr = pi->saddr,
                              .ports = (pi->ports << 16) | (pi->ports >> 16), .port = port};
    struct fp_flow *f = flows.lookup(&key);
    if (!f) {
        struct fp_flow fresh = {.end = pi->ack, .prev = pi->ack, .by_ack = 1};
        flows.update(&key, &fresh);
        return;
    }
    s32 adv = (s32)(pi->ack - f->end);
    if (adv <= 0)
        return;               // acknowledged below what the port has seen: nothing new
    f->end = pi->ack;         // everything below is the receiver's: a segment there now is resent
    f->prev = pi->ack;
    f->id = 0;
    f->by_ack = 1;
    if (adv > (s32)FP_SPAN_LIMIT)
        return;               // no window moves that far: the flow starts over
    struct fp_span *sp = span_cell(port, cls, id);
    if (sp)
        sp->span += (u32)adv;
}

// Returns 1 if the packet must be dropped.
static __always_inline int apply_fault(struct __sk_buff *skb, u32 port, u32 hook, struct pkt_info *pi) {
    u32 idx = port * 2 + hook;
    struct fp_fault *f = faults.lookup(&idx);
    if (!f || f->kind == FP_FAULT_NONE)
        return 0;
    struct fp_fault_stats *st = fault_stats.lookup(&idx);
    if (f->match_ip) {
        if (!pi->iph)
            return 0;
        if ((pi->saddr & f->src_mask) != f->src_net || (pi->daddr & f->dst_mask) != f->dst_net)
            return 0;
    }
    if (st)
        st->matched += 1;  // packets on the link matching the fault's endpoints
    if (f->period_ns) {  // flapping: active for on_ns of every period_ns (the clock read only here)
        if (((bpf_ktime_get_ns() - f->t0_ns) % f->period_ns) >= f->on_ns)
            return 0;
    }
    if (f->flow_frac < FP_ALL && flow_hash(pi) >= f->flow_frac)
        return 0;
    if (f->prob < FP_PROB_ONE && (f->prob == 0 || (u64)bpf_get_prandom_u32() >= f->prob))
        return 0;   // a rate-0 fault (set, not firing) draws no random number
    if (f->kind == FP_FAULT_CORRUPT) {
        if (!pi->iph)
            return 0;  // only IPv4 headers carry a checksum to break
        // Flip bits of the IP id field without fixing the checksum: the next hop
        // discards the packet as a header error, as it would a frame failing FCS.
        void *data = (void *)(long)skb->data;
        void *data_end = (void *)(long)skb->data_end;
        struct iphdr *iph = data + sizeof(struct ethhdr);
        if ((void *)(iph + 1) > data_end)
            return 0;
        iph->id ^= bpf_htons(0x5a5a);
        pi->kind = FP_KIND_BADHDR;
        if (st)
            st->hit += 1;
        return 0;
    }
    if (st)
        st->hit += 1;
    return 1;
}

// An injected drop, silent as a real one: the packet is redirected to the namespace's sink, an
// interface that is down and is no port, whose own tx_dropped is the only counter it reaches. A
// program's own drop (TC_ACT_SHOT) on egress counts in the port's tx_dropped (6.18, tcx and clsact
// alike): an interface-counter monitor then "sees" a fault that a real fabric would not show
// (tests/test_silent_faults.py reads every interface's statistics and the sink's count).
static __always_inline int fault_drop(struct fp_config *cfg) {
    if (cfg && cfg->sink)
        return bpf_redirect(cfg->sink, 0);
    return TC_ACT_SHOT;
}

// The switch port a packet crosses, or -1 for an interface that is no port: an array indexed by
// the interface index (inlined by the verifier: no hashing on the per-packet path).
static __always_inline int lookup_port(struct __sk_buff *skb) {
    u32 ifindex = skb->ifindex;
    u32 *p = ifindex_port.lookup(&ifindex);
    if (!p || *p == 0 || *p > NPORTS)
        return -1;
    return *p - 1;
}

// Send the packet out of ``port`` to the neighbour on that link. With the next hop given, the
// kernel goes straight to the neighbour table: no output route lookup, which was the largest part of
// a redirect's cost. An unknown port or interface leaves the packet to kernel routing.
static __always_inline int forward(u32 port) {
    struct fp_port *out = port_out.lookup(&port);
    if (!out || !out->ifindex)
        return TC_ACT_OK;
    if (!out->nh4)
        return redirect_neigh4(out->ifindex, NULL, 0, 0);
    struct bpf_redir_neigh nh = {.nh_family = AF_INET, .ipv4_nh = out->nh4};
    return redirect_neigh4(out->ifindex, &nh, sizeof(nh), 0);
}

int fp_ingress(struct __sk_buff *skb) {
    int found = lookup_port(skb);
    if (found < 0)
        return TC_ACT_UNSPEC;
    u32 port = found;
    int k0 = 0;
    struct fp_config *cfg = config.lookup(&k0);
    if (!cfg)
        return TC_ACT_UNSPEC;
    struct pkt_info pi = {};
    classify(skb, &pi, 1);
    if (apply_fault(skb, port, FP_HOOK_INGRESS, &pi))
        return fault_drop(cfg);
    u64 id = pi.iph ? pulse_tick(cfg, bpf_ktime_get_ns()) : pulse_now();
    count(skb, port, FP_DIR_IN, &pi, id);
    if (pi.proto == IPPROTO_TCP && pi.kind != FP_KIND_BADHDR) {
        // fabric links only: a spine's ports (remote leaf: the destination's), a leaf's uplinks (the source's)
        u32 cls = !cfg->leaf_class ? pi.dst_leaf : port < cfg->nuplinks ? pi.src : 0;
        if (cls >= 1 && cls <= NLEAVES)
            track_span(&pi, port, cls, id);
        // a spine's ACKs towards leaf L (out of its port L) carry the reference of the data coming in there
        if (!cfg->leaf_class && pi.src >= 1 && pi.src <= NLEAVES && pi.dst_leaf >= 1 && pi.dst_leaf <= NPORTS)
            track_ack(&pi, pi.dst_leaf - 1, pi.src, id);
    }
    if (pi.kind == FP_KIND_BADHDR)
        return TC_ACT_OK;  // never forward it: the kernel's IP input discards it (InCsumErrors)
    if (cfg->mode == FP_SPRAY_OFF || !pi.dst_leaf)
        return TC_ACT_OK;  // the kernel routes (spraying off: its ECMP picks the uplink)
    // Where the address plan alone decides the port, the program forwards (the kernel's IP input,
    // route lookup and forwarding are skipped; the egress program still counts and faults the packet):
    // a spine sends leaf L's hosts to its port L, a leaf sends its own hosts to their ports (the
    // fabric model's port order, topo.py; tests/test_datapath_unit.py checks each against it).
    if (!cfg->leaf_class)
        return forward(pi.dst_leaf - 1);
    if (pi.dst_leaf == cfg->leaf_class) {
        u32 a = bpf_ntohl(pi.daddr);
        u32 j = (a >> 8) & 0xff;                   // host j is 10.(L+1).j.2
        if ((a & 0xff) != 2 || j >= cfg->nhosts)
            return TC_ACT_OK;
        return forward(cfg->nuplinks + j);
    }
    // A leaf sprays packets that come from its hosts and go to another leaf.
    if (port < cfg->nuplinks)
        return TC_ACT_OK;
    u32 dst = pi.dst_leaf - 1;
    u32 *bank = spray_bank.lookup(&k0);
    u32 si = (bank && *bank ? NLEAVES : 0) + dst;
    struct fp_spray *sp = spray.lookup(&si);
    if (!sp || sp->len == 0 || sp->len > FP_SPRAY_SLOTS)
        return TC_ACT_OK;  // no uplink in service: leave it to kernel routing
    u32 pick;
    if (cfg->mode == FP_SPRAY_RANDOM) {
        pick = bpf_get_prandom_u32() % sp->len;
    } else {
        u32 rk = cfg->mode == FP_SPRAY_RRDST ? dst : NLEAVES;
        u32 *rot = rotation.lookup(&rk);
        if (!rot)
            return TC_ACT_OK;
        pick = *rot % sp->len;
        *rot = pick + 1;
    }
    if (pick >= FP_SPRAY_SLOTS)
        return TC_ACT_OK;
    u32 up = sp->slot[pick];
    u64 *ss = spray_stats.lookup(&up);
    if (ss)
        *ss += 1;
    return forward(up);
}

int fp_egress(struct __sk_buff *skb) {
    int found = lookup_port(skb);
    if (found < 0)
        return TC_ACT_UNSPEC;
    u32 port = found;
    struct pkt_info pi = {};
    classify(skb, &pi, 0);
    count(skb, port, FP_DIR_OUT, &pi, pulse_now());   // every packet sent came in on a port: the clock moved there
    if (apply_fault(skb, port, FP_HOOK_EGRESS, &pi)) {
        int k0 = 0;
        return fault_drop(config.lookup(&k0));
    }
    return TC_ACT_OK;
}
