// BCC's program syntax for a plain clang build loaded with libbpf (the site agent's counting
// object, netns_testbed/bpfobject.py). Included first, only when FP_LIBBPF is defined, so that
// count.c, counting.inc and packet.h are one text for both toolchains: BCC compiles them at run
// time for the testbed's switches; clang compiles them once, at build time, into count.bpf.o.
//
// What BCC's front end does by rewriting, this header does in C:
//  - BPF_ARRAY(name, ...) and its kin declare a BTF-defined map `name__map` (section .maps) and a
//    constant table `name` of its accessors, so that `name.lookup(&key)` is a call through a
//    constant that clang folds into `bpf_map_lookup_elem(&name__map, &key)` at -O2 (no indirect call
//    reaches the object: the verifier would refuse it).
//  - The switch's shape (NPORTS, NSRC) is read from `fp_shape` in .rodata, which the loader writes
//    before the load (the kernel then freezes it: the verifier sees constants). A map whose size
//    depends on the shape is declared with one entry here; the loader sizes it from the same table
//    the readers use (datapath.counter_map_entries). FP_RING stays a compile-time constant.
// The object reads only the packet and __sk_buff (which the verifier rewrites for each kernel), so
// it carries no CO-RE relocations: it loads on any kernel with BPF ring buffers, BTF-defined maps
// and tc clsact or tcx, with no kernel headers on the machine.
#ifndef FLOWPULSE_LIBBPF_COMPAT_H
#define FLOWPULSE_LIBBPF_COMPAT_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;

// The shape the loader writes (agent/counting.py, LibbpfCounting); mirrored as datapath.Shape and
// checked like every other mirrored struct (contract.py).
struct fp_shape {
    u32 nports;
    u32 nsrc;
};
const volatile struct fp_shape fp_shape = {1, 3};
#define NPORTS (fp_shape.nports)
#define NSRC (fp_shape.nsrc)

// A size the compiler knows is kept; one that depends on the shape is set by the loader.
#define FP_MAP_SIZE(n) __builtin_choose_expr(__builtin_constant_p(n), (n), 1)

#define FP_LIBBPF_MAP(_name, _type, _key, _value, _n, _flags)                        \
    struct {                                                                         \
        __uint(type, _type);                                                         \
        __uint(max_entries, FP_MAP_SIZE(_n));                                        \
        __uint(map_flags, _flags);                                                   \
        __type(key, _key);                                                           \
        __type(value, _value);                                                       \
    } _name##__map SEC(".maps");                                                     \
    static __always_inline _value *_name##__lookup(const void *key) {                \
        return bpf_map_lookup_elem(&_name##__map, key);                              \
    }                                                                                \
    static const struct { _value *(*lookup)(const void *); } _name = {_name##__lookup}

#define BPF_ARRAY(_name, _value, _n) \
    FP_LIBBPF_MAP(_name, BPF_MAP_TYPE_ARRAY, u32, _value, _n, 0)
#define BPF_PERCPU_ARRAY(_name, _value, _n) \
    FP_LIBBPF_MAP(_name, BPF_MAP_TYPE_PERCPU_ARRAY, u32, _value, _n, 0)
#define BPF_HASH(_name, _key, _value, _n) \
    FP_LIBBPF_MAP(_name, BPF_MAP_TYPE_HASH, _key, _value, _n, 0)
#define BPF_LPM_TRIE(_name, _key, _value, _n) \
    FP_LIBBPF_MAP(_name, BPF_MAP_TYPE_LPM_TRIE, _key, _value, _n, BPF_F_NO_PREALLOC)

// BPF_RINGBUF_OUTPUT(name, pages): a ring of `pages` pages and its one method.
#define BPF_RINGBUF_OUTPUT(_name, _pages)                                                    \
    struct {                                                                                 \
        __uint(type, BPF_MAP_TYPE_RINGBUF);                                                  \
        __uint(max_entries, (_pages) * 4096);                                                \
    } _name##__map SEC(".maps");                                                             \
    static __always_inline long _name##__output(void *data, u64 size, u64 flags) {           \
        return bpf_ringbuf_output(&_name##__map, data, size, flags);                          \
    }                                                                                        \
    static const struct { long (*ringbuf_output)(void *, u64, u64); } _name = {_name##__output}

// Each program in its own section, as BCC loads them: SEC("tc") is a classifier to libbpf.
#define FP_PROG SEC("tc")

char _license[] SEC("license") = "GPL";

#endif
