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
// Two builds of this one text (agent/counting.py loads either):
//  - BCC at run time, with compile-time parameters (-D, set by agent/counting.py from the site):
//      NPORTS  ports of this switch      NSRC  leaves + 2 source classes
//      FP_RING pulses kept per counter (ring slots, a power of two; see switch.h)
//  - clang once, at build time (-DFP_LIBBPF, netns_testbed/bpfobject.py): count.bpf.o, loaded with
//    libbpf; NPORTS and NSRC are then read from .rodata, which the loader writes
//    (bpf/libbpf_compat.h says how BCC's syntax compiles there).
#ifdef FP_LIBBPF
#include "libbpf_compat.h"
#endif
#ifndef FP_PROG
#define FP_PROG
#endif
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#include "switch.h"

BPF_HASH(ifindex_port, u32, u32, 256);             // this machine's ifindex -> port
BPF_ARRAY(config, struct fp_config, 1);            // only gap_units is used
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

// FLOWPULSE_SPLICE(counting.inc): the shared maps, pulse_tick(), pulse_now(), count()

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

FP_PROG int fp_count_in(struct __sk_buff *skb) {
    return count_packet(skb, FP_DIR_IN);
}

FP_PROG int fp_count_out(struct __sk_buff *skb) {
    return count_packet(skb, FP_DIR_OUT);
}
