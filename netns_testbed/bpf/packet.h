// What every FlowPulse program does to a packet it counts: classify it, stamp the
// pulse clock, count it. Shared by switch.c (the testbed's switches) and count.c
// (the agent's counting-only program for any Linux box), so the two count alike.
//
// The including program first defines NPORTS, NSRC and FP_RING (-D flags), and two
// functions of an IPv4 address in network byte order:
//   fp_source_class(addr): 1..NSRC-2 = source leaf + 1, 0 = other IPv4
//   fp_dest_class(addr):   destination leaf + 1, 0 = none (only switch.c sprays by it)
// Its maps (declared and looked up in bpf/counting.inc, which the loader splices into
// each program: BCC rewrites map accesses only in the text it compiles):
//   counters  per-CPU fp_count, FP_RING * FP_NCOUNTERS: per pulse [slot][port][dir][src]
//   dup       per-CPU fp_dup, FP_RING * NPORTS * 2: per-pulse D-SACKs [slot][port][dir]
//   totals    per-CPU fp_counter, NPORTS * 2 * FP_NKIND: cumulative [port][dir][kind]
//   pulse     u64 [2]: [0] packed id/last time, [1] current pulse's start ns
//   pulses    fp_pulse_rec [FP_RING]: each slot's pulse, start and end
#ifndef FLOWPULSE_PACKET_H
#define FLOWPULSE_PACKET_H

struct pkt_info {
    u32 src;        // source class: 1..NLEAVES = source leaf + 1, 0 other IPv4, NSRC-1 not IPv4
    u32 kind;       // FP_KIND_*
    u32 dst_leaf;   // destination leaf + 1 from the destination address, 0 if none
    u32 ports;      // TCP/UDP source << 16 | destination port, 0 if none
    u32 saddr, daddr;
    u8 proto;
    u32 dsack;      // sequence bytes a D-SACK block in this TCP segment reports (RFC 2883), 0 if none
    u32 seq;        // TCP: the segment's first sequence number (host order)
    u32 payload;    // TCP: payload bytes (from the IPv4 total length)
    u8 syn_rst;     // TCP: SYN or RST set (a connection's sequence space starts over)
    u8 ack_flag;    // TCP: ACK set (ack holds the cumulative acknowledgement)
    u32 ack;        // TCP: the acknowledgement number (host order), if ack_flag
    u16 ip_id;      // IPv4 identification (host order): a Linux sender counts it per connection, retransmissions included
    struct iphdr *iph;
};

// A TCP receiver that gets bytes it already has (a spurious retransmission: the
// first copy was reordered or late, not lost) says so with a D-SACK: the first
// SACK block of its ACK lies below the cumulative ACK, or inside the second
// block (RFC 2883). A leaf counts the duplicates towards a host as packets sent
// to it twice, like the retransmissions after a loss on its link to the host;
// the D-SACKs coming back from the host tell the two apart. Returns the bytes
// the block reports, 0 without one.
//
// The options are read with bpf_skb_load_bytes at the offset where the previous
// option ended, at most FP_TCP_OPT_STEPS options (a Linux ACK: NOP NOP TS NOP NOP
// SACK): the verifier refuses packet pointers moved by a variable amount (and
// stack reads at a variable offset) to a program loaded without CAP_PERFMON, and
// the site agent runs with CAP_BPF and CAP_NET_ADMIN alone. `off` is where the
// options start in the frame, `end` where the TCP header ends.
#define FP_TCP_OPT_STEPS 10
static __always_inline u32 be32_of(u8 *p) {
    return ((u32)p[0] << 24) | ((u32)p[1] << 16) | ((u32)p[2] << 8) | (u32)p[3];
}

static __always_inline u32 dsack_bytes(struct __sk_buff *skb, u32 off, u32 end, u32 ack) {
#pragma unroll
    for (int n = 0; n < FP_TCP_OPT_STEPS; n++) {
        u8 kl[2];
        if (off + 2 > end || bpf_skb_load_bytes(skb, off, kl, 2) < 0)
            return 0;
        if (kl[0] == 0)      // end of options
            return 0;
        if (kl[0] == 1) {    // NOP
            off += 1;
            continue;
        }
        if (kl[1] < 2)
            return 0;
        if (kl[0] == 5) {    // SACK: 2 + 8 n bytes
            u8 b[16];
            if (kl[1] < 10 || off + 10 > end || bpf_skb_load_bytes(skb, off + 2, b, 8) < 0)
                return 0;
            u32 start = be32_of(b), stop = be32_of(b + 4);
            if ((s32)(stop - start) <= 0)
                return 0;
            if ((s32)(start - ack) < 0)
                return stop - start;               // below the cumulative ACK
            if (kl[1] >= 18 && off + 18 <= end && bpf_skb_load_bytes(skb, off + 10, b + 8, 8) == 0) {
                u32 s2 = be32_of(b + 8), e2 = be32_of(b + 12);
                if ((s32)(start - s2) >= 0 && (s32)(e2 - stop) >= 0)
                    return stop - start;           // inside the second block
            }
            return 0;
        }
        off += kl[1];
    }
    return 0;
}

// Real switches discard frames that fail the FCS and count them as errors; here
// a corrupted IPv4 header (bad checksum) plays that part. The sum runs over the
// whole header: the fixed 20 bytes through the packet pointer, options (at most
// 40 bytes) through bpf_skb_load_bytes (the verifier refuses a packet pointer
// moved by the header's variable length).
static __always_inline int ipv4_header_ok(struct __sk_buff *skb, struct iphdr *iph, void *data_end) {
    u16 *w = (u16 *)iph;
    if ((void *)(w + 10) > data_end)
        return 0;
    u32 sum = 0;
#pragma unroll
    for (int i = 0; i < 10; i++)
        sum += w[i];
    u32 optlen = iph->ihl * 4;
    if (optlen < 20)
        return 0;
    optlen -= 20;
    // Options (rare) are read one 4-byte word at a time: a read of variable length needs bounds that
    // 6.1's verifier cannot see here ("invalid zero-sized read": it learns no lower bound from
    // "!= 0", and clang turns two bounds into one range check on a copy of the register).
#pragma unroll
    for (int i = 0; i < 10; i++) {
        if ((u32)i * 4 >= optlen)
            break;
        u16 opt[2];
        if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + 20 + i * 4, opt, sizeof(opt)) < 0)
            return 0;
        sum += opt[0] + opt[1];
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return sum == 0xffff;
}

// check_hdr: verify the IPv4 header checksum (ingress only: a switch never
// forwards a damaged frame, so egress has nothing to find and skips the work).
static __always_inline void classify(struct __sk_buff *skb, struct pkt_info *pi, int check_hdr) {
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    pi->src = NSRC - 1;
    pi->kind = FP_KIND_NONIP;
    pi->dst_leaf = 0;
    pi->ports = 0;
    pi->proto = 0;
    pi->saddr = pi->daddr = 0;
    pi->dsack = 0;
    pi->seq = 0;
    pi->payload = 0;
    pi->syn_rst = 0;
    pi->ack_flag = 0;
    pi->ack = 0;
    pi->ip_id = 0;
    pi->iph = 0;
    if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return;
    struct iphdr *iph = (void *)(eth + 1);
    if ((void *)(iph + 1) > data_end)
        return;
    pi->iph = iph;
    pi->ip_id = bpf_ntohs(iph->id);
    pi->saddr = iph->saddr;
    pi->daddr = iph->daddr;
    pi->src = fp_source_class(iph->saddr);
    pi->dst_leaf = fp_dest_class(iph->daddr);
    pi->proto = iph->protocol;
    if (check_hdr && !ipv4_header_ok(skb, iph, data_end)) {
        pi->kind = FP_KIND_BADHDR;
        return;
    }
    pi->kind = FP_KIND_OTHER;
    u32 ihl = iph->ihl * 4;
    if (iph->protocol == IPPROTO_TCP && ihl == sizeof(*iph)) {
        struct tcphdr *th = (void *)iph + sizeof(*iph);
        if ((void *)(th + 1) <= data_end) {
            u32 payload = bpf_ntohs(iph->tot_len) - ihl - th->doff * 4;
            pi->kind = payload > 0 ? FP_KIND_TCP_DATA : FP_KIND_TCP_CTRL;
            pi->ports = ((u32)th->source << 16) | th->dest;
            pi->seq = bpf_ntohl(th->seq);
            pi->payload = payload;
            pi->syn_rst = th->syn | th->rst;
            pi->ack_flag = th->ack;
            pi->ack = bpf_ntohl(th->ack_seq);
            u8 *opt = (u8 *)(th + 1);
            if (th->doff > 5 && !(th->doff == 8 && (void *)(opt + 4) <= data_end && opt[0] == 1 && opt[1] == 1 &&
                                  opt[2] == 8 && opt[3] == 10)) {
                // (Linux's usual segment, NOP NOP timestamps and nothing else, has no SACK: not walked)
                u32 tcp_off = sizeof(*eth) + sizeof(*iph);   // a 20-byte IPv4 header (checked above)
                pi->dsack = dsack_bytes(skb, tcp_off + sizeof(*th), tcp_off + th->doff * 4, bpf_ntohl(th->ack_seq));
            }
        }
    } else if (iph->protocol == IPPROTO_UDP && ihl == sizeof(*iph)) {
        struct udphdr *uh = (void *)iph + sizeof(*iph);
        if ((void *)(uh + 1) <= data_end)
            pi->ports = ((u32)uh->source << 16) | uh->dest;
    }
}

// Pulses: an idle gap longer than gap_units (units of 2^FP_PULSE_UNIT_SHIFT ns) between
// IPv4 packets starts a new pulse. The id and last-seen time share one 64-bit
// word (*st) so that a racing CPU sees either the old or the new pair, never a
// mix; *start is the current pulse's start time in ns. Returns the current
// pulse id (24 bits); when this packet opened a new pulse, *closed is set to the
// previous word (its id and last time unit). (pulse_tick() in bpf/counting.inc
// looks the words up and calls this.)
#define FP_PULSE_ID(word) ((word) >> FP_PULSE_TIME_BITS)
static __always_inline u64 pulse_advance(u64 *st, u64 *start, u32 gap_units, u64 now, u64 *closed) {
    u64 old = *st;
    u64 now_u = (now >> FP_PULSE_UNIT_SHIFT) & FP_PULSE_TIME_MASK;
    u64 last_u = old & FP_PULSE_TIME_MASK;
    u64 id = FP_PULSE_ID(old);
    if (old == 0 || ((now_u - last_u) & FP_PULSE_TIME_MASK) > gap_units) {
        id = (id + 1) & ((1ULL << (64 - FP_PULSE_TIME_BITS)) - 1);
        *start = now;
        *closed = old;
    } else if (now_u == last_u) {
        return id;  // same time unit: nothing to write
    }
    *st = (id << FP_PULSE_TIME_BITS) | now_u;
    return id;
}

_Static_assert(FP_RING > 0 && (FP_RING & (FP_RING - 1)) == 0, "FP_RING must be a power of two");
#define FP_NCOUNTERS (NPORTS * 2 * NSRC)   // ring elements of one pulse

static __always_inline u32 ring_slot(u64 id) {
    return id & (FP_RING - 1);
}

// Count a packet of `kind` in a ring element for pulse `id`, starting the element over if it
// still holds an older pulse. Every kind's field gets `kind == k` added at a constant offset:
// an index computed from the packet (pkts[kind]) is pointer arithmetic on a map value, which
// the verifier refuses to a program loaded without CAP_PERFMON (the site unit).
static __always_inline void ring_count(struct fp_count *c, u32 id, u32 kind) {
    if (c->pulse != id) {
        c->pulse = id;
#pragma unroll
        for (int k = 0; k < FP_NKIND; k++)
            c->pkts[k] = 0;
    }
    // one constant offset per kind, no pointer moved by a variable: the site agent's program is loaded
    // without CAP_PERFMON, whose verifier refuses `c->pkts[kind]` ("pointer arithmetic ... prohibited
    // for !root"; tests/test_site_agent.py's unit-file test loads it that way)
#pragma unroll
    for (int k = 0; k < FP_NKIND; k++)
        c->pkts[k] += kind == k;
}

static __always_inline void ring_dup(struct fp_dup *d, u64 id, u32 bytes) {
    if (d->pulse != id) {
        d->pulse = id;
        d->segs = 0;
        d->bytes = 0;
    }
    d->segs += 1;
    d->bytes += bytes;
}

// Index of a packet's element in `counters`: [slot][port][dir][source class].
static __always_inline u32 counter_index(u64 id, u32 port, u32 dir, struct pkt_info *pi) {
    return ring_slot(id) * FP_NCOUNTERS + (port * 2 + dir) * NSRC + pi->src;
}

// Index in `totals` (cumulative since load, no source class): [port][dir][kind].
static __always_inline u32 total_index(u32 port, u32 dir, struct pkt_info *pi) {
    return (port * 2 + dir) * FP_NKIND + pi->kind;
}

// Index in `dup`: [slot][port][dir].
static __always_inline u32 dup_index(u64 id, u32 port, u32 dir) {
    return ring_slot(id) * NPORTS * 2 + port * 2 + dir;
}

#endif
