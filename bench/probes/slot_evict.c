// slot_evict.c - the shared-memory slots' copy rate between two threads pinned to cores 0 and 1,
// with and without the reader evicting each slot from the caches (clflushopt) before it hands
// it back. A writer copies 256 KiB pieces of a 16 MiB source into a ring of slots; a reader
// copies (or adds) each slot into a 16 MiB destination, then frees the slot. 1 GiB moved, best
// of 3, GB/s. It asks whether the writer's copy into a slot the reader has just read (every
// line a cross-core ownership transfer) is cheaper from memory than from the other core's cache
// (bench/RESULTS.md "Measured and dropped, 2026-12-06").
// Build: gcc -O2 -mclflushopt -pthread slot_evict.c -o slot_evict
// Run:   ./slot_evict SLOT_KIB SLOTS FLUSH(0 none, 1 clflushopt, 2 clflush) REDUCE(0 copy, 1 add)
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPAN (16u << 20)
static size_t slot, nslot, total;
static int flush, reduce;
static char *ring, *src, *dst;
static _Atomic unsigned long head, tail;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *writer(void *arg) {
    (void)arg;
    for (size_t i = 0; i < total / slot; i++) {
        while (i - atomic_load_explicit(&tail, memory_order_acquire) >= nslot) _mm_pause();
        memcpy(ring + (i % nslot) * slot, src + (i * slot) % SPAN, slot);
        atomic_store_explicit(&head, i + 1, memory_order_release);
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    for (size_t i = 0; i < total / slot; i++) {
        while (atomic_load_explicit(&head, memory_order_acquire) <= i) _mm_pause();
        char *s = ring + (i % nslot) * slot;
        float *d = (float *)(dst + (i * slot) % SPAN), *f = (float *)s;
        if (reduce) {
            for (size_t k = 0; k < slot / 4; k++) d[k] += f[k];
        } else {
            memcpy(d, s, slot);
        }
        for (size_t k = 0; flush && k < slot; k += 64) {
            if (flush == 1) _mm_clflushopt(s + k); else _mm_clflush(s + k);
        }
        atomic_store_explicit(&tail, i + 1, memory_order_release);
    }
    return NULL;
}

static void pin(pthread_t t, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(t, sizeof set, &set);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s SLOT_KIB SLOTS FLUSH REDUCE\n", argv[0]);
        return 2;
    }
    slot = (size_t)atoi(argv[1]) << 10, nslot = atoi(argv[2]), flush = atoi(argv[3]), reduce = atoi(argv[4]);
    total = (size_t)1 << 30;
    ring = aligned_alloc(4096, slot * nslot), src = aligned_alloc(4096, SPAN), dst = aligned_alloc(4096, SPAN);
    memset(ring, 1, slot * nslot), memset(src, 0, SPAN), memset(dst, 0, SPAN);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        head = tail = 0;
        pthread_t w, rd;
        double t = now();
        pthread_create(&w, NULL, writer, NULL), pthread_create(&rd, NULL, reader, NULL);
        pin(w, 0), pin(rd, 1);
        pthread_join(w, NULL), pthread_join(rd, NULL);
        double gbs = total / (now() - t) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("slot %zu KiB x %zu, flush %d, reduce %d: %.2f GB/s\n", slot >> 10, nslot, flush, reduce, best);
    return 0;
}
