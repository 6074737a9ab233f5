// The cheapest possible tc program: lets the packet continue. bench/datapath.py
// attaches it to every switch port to measure what the clsact hooks cost alone.
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

int noop(struct __sk_buff *skb) {
    return TC_ACT_UNSPEC;
}
