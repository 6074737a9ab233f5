// FlowPulse counting program for any Linux box (`flowpulse agent --site`).
//
// The testbed switch's count and pulse clock (packet.h) and nothing else: no
// spraying, no faults, no forwarding decision. Every packet goes on
// (TC_ACT_UNSPEC) to whatever the machine runs next: the kernel's own
// forwarding, another tc filter, a software switch. Attached with tc clsact at
// priority 1 on ingress and egress of each port the site file lists.
//
// A packet's source class comes from the site's address prefixes (an LPM trie
// filled by the loader) instead of the testbed's address plan.
//
// Compile-time parameters (-D, set by agent/counting.py from the site):
//   NPORTS  ports of this switch      NSRC  leaves + 2 source classes
//   FP_RING pulses kept per counter (ring slots, a power of two; see switch.h)
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#include "switch.h"

BPF_PERCPU_ARRAY(counters, struct fp_count, FP_RING * NPORTS * 2 * NSRC);   // per pulse [slot][port][dir][src]
BPF_PERCPU_ARRAY(dup, struct fp_dup, FP_RING * NPORTS * 2);   // [slot][port][dir]: segments carrying a D-SACK, bytes it reports
BPF_PERCPU_ARRAY(totals, struct fp_counter, NPORTS * 2 * FP_NKIND);   // cumulative [port][dir][kind]
BPF_HASH(ifindex_port, u32, u32, 256);             // this machine's ifindex -> port
BPF_ARRAY(config, struct fp_config, 1);            // only gap_units is used
BPF_ARRAY(pulse, u64, 2);                          // [0] packed id/last time, [1] start ns
BPF_ARRAY(pulses, struct fp_pulse_rec, FP_RING);   // each ring slot's pulse, start and end
BPF_LPM_TRIE(source_prefix, struct fp_prefix_key, u32, FP_MAX_PREFIXES);

static __always_inline u32 site_source_class(u32 addr_be) {
    struct fp_prefix_key key = {.prefixlen = 32, .addr = addr_be};
    u32 *cls = source_prefix.lookup(&key);
    if (cls && *cls < NSRC - 1)
        return *cls;
    return 0;
}

static __always_inline u32 no_dest_class(u32 addr_be) {
    return 0;
}

#define fp_source_class site_source_class
#define fp_dest_class no_dest_class
#include "packet.h"

// Map accesses stay in the compiled file (BCC rewrites them only there).
// The pulse clock on an IPv4 packet: returns the current pulse id; a packet that
// opens a pulse closes the previous one's record and starts its own.
static __always_inline u64 pulse_tick(struct fp_config *cfg, u64 now) {
    int k0 = 0, k1 = 1;
    u64 *st = pulse.lookup(&k0);
    u64 *start = pulse.lookup(&k1);
    if (!st || !start)
        return 0;
    u64 closed = ~0ULL;
    u64 id = pulse_advance(st, start, cfg->gap_units, now, &closed);
    if (closed != ~0ULL) {
        u32 ps = ring_slot(FP_PULSE_ID(closed));
        struct fp_pulse_rec *prev = pulses.lookup(&ps);
        if (prev && prev->pulse == FP_PULSE_ID(closed))
            prev->end_ns = (closed & FP_PULSE_TIME_MASK) << FP_PULSE_UNIT_SHIFT;
        u32 ns = ring_slot(id);
        struct fp_pulse_rec *rec = pulses.lookup(&ns);
        if (rec) {
            rec->pulse = id;
            rec->start_ns = now;
            rec->end_ns = 0;
        }
    }
    return id;
}

// The current pulse id, for packets that do not move the clock.
static __always_inline u64 pulse_now(void) {
    int k0 = 0;
    u64 *st = pulse.lookup(&k0);
    return st ? FP_PULSE_ID(*st) : 0;
}

static __always_inline void count(struct __sk_buff *skb, u32 port, u32 dir, struct pkt_info *pi, u64 id) {
    u32 idx = counter_index(id, port, dir, pi);
    struct fp_count *c = counters.lookup(&idx);
    if (c)
        ring_count(c, id, pi->kind);
    u32 ti = total_index(port, dir, pi);
    struct fp_counter *t = totals.lookup(&ti);
    if (t) {
        t->pkts += 1;
        t->bytes += skb->len;
    }
    if (pi->dsack) {
        u32 di = dup_index(id, port, dir);
        struct fp_dup *d = dup.lookup(&di);
        if (d)
            ring_dup(d, id, pi->dsack);
    }
}

static __always_inline int count_packet(struct __sk_buff *skb, u32 dir) {
    u32 ifindex = skb->ifindex;
    u32 *port = ifindex_port.lookup(&ifindex);
    if (!port || *port >= NPORTS)
        return TC_ACT_UNSPEC;
    int k0 = 0;
    struct fp_config *cfg = config.lookup(&k0);
    if (!cfg)
        return TC_ACT_UNSPEC;
    struct pkt_info pi = {};
    classify(skb, &pi, dir == FP_DIR_IN);
    // Both directions stamp the clock: on a machine that also sends (a host with
    // several NICs), its own packets are part of the pulse.
    u64 id = pi.iph ? pulse_tick(cfg, bpf_ktime_get_ns()) : pulse_now();
    count(skb, *port, dir, &pi, id);
    return TC_ACT_UNSPEC;
}

int fp_count_in(struct __sk_buff *skb) {
    return count_packet(skb, FP_DIR_IN);
}

int fp_count_out(struct __sk_buff *skb) {
    return count_packet(skb, FP_DIR_OUT);
}
