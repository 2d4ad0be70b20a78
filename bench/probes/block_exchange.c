// block_exchange.c - the floor of a 2-rank exchange of B bytes each way between private
// buffers, the data movement of a 2-rank all-gather of 2B bytes (each rank's block to the
// other) and of a reduce-scatter's or an all-reduce's rounds. Two processes, no library: each
// iteration sets its input's first and last 8 bytes to the iteration number, moves its block
// to the peer and waits for the peer's, and checks both words of what arrived. Three ways:
//   stage  copy the block into shared memory, publish a flag line; wait for the peer's flag,
//          copy its block out (two copies; what oxccl's slots and Open MPI's eager path do);
//   ll     the same, but every 64-byte line carries 56 data bytes and its own flag (the
//          receiver copies each line as it arrives, no separate flag line: NCCL's LL128 idea
//          with x86's store order doing the work of the 128-byte store);
//   cma    publish a flag; the peer reads the block straight from this process with
//          process_vm_readv(2) and says when it is done (one copy, two hand-offs each way).
// Shared-memory lines are reused by iteration parity, so their previous contents were read by
// the other core, as in a library's slots. Prints, per block size, the median of 7 runs of each
// way in µs per iteration (runs interleaved), and the best of the three.
// Build: gcc -O2 block_exchange.c -o block_exchange   Run: ./block_exchange [sizes in bytes...]
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAXB = 64 << 10, LLD = 56, LLN = (MAXB + LLD - 1) / LLD, RUNS = 7, WAYS = 3 };

struct llline { char data[LLD]; _Atomic uint64_t flag; } __attribute__((aligned(64)));

struct area {
    _Alignas(64) _Atomic uint64_t ready; // stage, cma: this rank's block of iteration g is there
    _Alignas(64) _Atomic uint64_t done;  // cma: this rank has read the peer's block of g
    _Alignas(64) uint64_t addr;          // cma: this rank's input buffer
    pid_t pid;
    _Alignas(64) char block[2][MAXB];    // stage
    struct llline ll[2][LLN];            // ll
};

static const char *names[WAYS] = {"stage", "ll", "cma"};
static long wrong;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void wait_ge(_Atomic uint64_t *f, uint64_t v) {
    while (atomic_load_explicit(f, memory_order_acquire) < v) {
    }
}

static void mark(char *in, size_t b, uint64_t g) {
    memcpy(in, &g, 8);
    if (b >= 16) memcpy(in + b - 8, &g, 8);
}

static void check(const char *out, size_t b, uint64_t g) {
    uint64_t x, y = g;
    memcpy(&x, out, 8);
    if (b >= 16) memcpy(&y, out + b - 8, 8);
    wrong += (x != g) + (y != g);
}

static void stage(struct area *me, struct area *peer, char *in, char *out, size_t b, uint64_t g) {
    mark(in, b, g);
    memcpy(me->block[g & 1], in, b);
    atomic_store_explicit(&me->ready, g, memory_order_release);
    wait_ge(&peer->ready, g);
    memcpy(out, peer->block[g & 1], b);
    check(out, b, g);
}

static void ll(struct area *me, struct area *peer, char *in, char *out, size_t b, uint64_t g) {
    mark(in, b, g);
    struct llline *mine = me->ll[g & 1], *theirs = peer->ll[g & 1];
    for (size_t k = 0, o = 0; o < b; k++, o += LLD) {
        if (b - o >= LLD)
            memcpy(mine[k].data, in + o, LLD); // (a constant size: inlined moves)
        else
            memcpy(mine[k].data, in + o, b - o);
        atomic_store_explicit(&mine[k].flag, g, memory_order_release);
    }
    for (size_t k = 0, o = 0; o < b; k++, o += LLD) {
        wait_ge(&theirs[k].flag, g);
        if (b - o >= LLD)
            memcpy(out + o, theirs[k].data, LLD);
        else
            memcpy(out + o, theirs[k].data, b - o);
    }
    check(out, b, g);
}

static void cma(struct area *me, struct area *peer, char *in, char *out, size_t b, uint64_t g) {
    wait_ge(&peer->done, g - 1); // the peer has read the block of g - 1
    mark(in, b, g);
    atomic_store_explicit(&me->ready, g, memory_order_release);
    wait_ge(&peer->ready, g);
    struct iovec l = {out, b}, r = {(void *)peer->addr, b};
    if (process_vm_readv(peer->pid, &l, 1, &r, 1, 0) != (ssize_t)b) {
        perror("process_vm_readv");
        exit(1);
    }
    atomic_store_explicit(&me->done, g, memory_order_release);
    check(out, b, g);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t def[] = {8, 2048, 4096, 16384, 32768, 65536}, sizes[16];
    int ns = 0;
    for (int i = 1; i < argc && ns < 16; i++) sizes[ns++] = strtoul(argv[i], NULL, 0);
    if (ns == 0) memcpy(sizes, def, sizeof def), ns = 6;
    for (int i = 0; i < ns; i++)
        if (sizes[i] < 8 || sizes[i] > MAXB) return fprintf(stderr, "sizes: 8..%d bytes\n", MAXB), 2;
    struct area *a = mmap(NULL, 2 * sizeof(struct area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return 1;
    char *in = aligned_alloc(4096, MAXB), *out = aligned_alloc(4096, MAXB);
    memset(in, 1, MAXB), memset(out, 0, MAXB);
    pid_t child = fork();
    int r = child == 0;
    struct area *me = &a[r], *peer = &a[1 - r];
    me->addr = (uint64_t)in, me->pid = getpid();
    void (*way[WAYS])(struct area *, struct area *, char *, char *, size_t, uint64_t) = {stage, ll, cma};
    static double us[16][WAYS][RUNS];
    uint64_t g = 0;
    atomic_store(&me->ready, 1), wait_ge(&peer->ready, 1), g = 1; // the areas are filled in
    for (int run = 0; run < RUNS; run++)
        for (int s = 0; s < ns; s++)
            for (int w = 0; w < WAYS; w++) {
                size_t b = sizes[s];
                long n = b <= 4096 ? 100000 : b <= 16384 ? 30000 : 10000;
                atomic_store(&me->done, g); // cma: no read of this input is under way
                double t0 = now();
                for (long i = 0; i < n; i++) way[w](me, peer, in, out, b, ++g);
                us[s][w][run] = (now() - t0) / n * 1e6;
            }
    atomic_store(&me->ready, ++g), wait_ge(&peer->ready, g); // no read of either input under way
    if (r) _exit(wrong ? 1 : 0);
    int st = 0;
    waitpid(child, &st, 0);
    printf("# block exchange: B bytes each way between 2 processes, µs per iteration, median of %d runs (min-max)\n", RUNS);
    for (int s = 0; s < ns; s++) {
        printf("%8zu B", sizes[s]);
        double best = 1e30;
        for (int w = 0; w < WAYS; w++) {
            double *u = us[s][w];
            qsort(u, RUNS, sizeof *u, cmp);
            printf("  %s %.3f (%.3f-%.3f)", names[w], u[RUNS / 2], u[0], u[RUNS - 1]);
            if (u[RUNS / 2] < best) best = u[RUNS / 2];
        }
        printf("  best %.3f\n", best);
    }
    if (wrong || st) printf("wrong %ld (peer %s)\n", wrong, st ? "wrong too" : "right");
    return wrong || st;
}
