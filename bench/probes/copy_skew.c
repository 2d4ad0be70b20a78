// copy_skew.c - how fast the C library's memcpy runs when the destination lies `skew` bytes past
// the source (modulo a page), against a plain AVX2 loop with aligned stores (the loop of
// oxccl_simd::copy). On the AMD EPYC VM of bench/RESULTS.md, glibc's `rep movsb` (used for 2 KiB
// to 512 KiB) ran skews of 1-31 at 2-3 GB/s against 50-95 at skew 0.
// Build: gcc -O2 copy_skew.c -o copy_skew     Run: ./copy_skew   (prints GB/s, best of 7)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) static void vcopy(char *d, const char *s, size_t n) {
    __m256i head = _mm256_loadu_si256((const __m256i *)s), tail = _mm256_loadu_si256((const __m256i *)(s + n - 32));
    size_t i = 32 - ((uintptr_t)d & 31);
    for (; i + 128 <= n; i += 128)
        for (int k = 0; k < 4; k++)
            _mm256_store_si256((__m256i *)(d + i + 32 * k), _mm256_loadu_si256((const __m256i *)(s + i + 32 * k)));
    for (; i + 32 <= n; i += 32) _mm256_store_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
    _mm256_storeu_si256((__m256i *)d, head);
    _mm256_storeu_si256((__m256i *)(d + n - 32), tail);
}

static double rate(char *d, const char *s, size_t n, int vector) {
    double best = 1e9;
    for (int r = 0; r < 7; r++) {
        double t = now();
        for (int i = 0; i < 20; i++) {
            if (vector) vcopy(d, s, n); else memcpy(d, s, n);
            __asm__ volatile("" ::"r"(d) : "memory");
        }
        t = (now() - t) / 20;
        if (t < best) best = t;
    }
    return n / best / 1e9;
}

int main(void) {
    size_t sizes[] = {4096, 65536, 262144, 1 << 20};
    int skews[] = {-8, 0, 1, 8, 16, 24, 31, 32, 33, 40, 48, 63, 64, 72};
    char *a = aligned_alloc(4096, 4 << 20), *b = aligned_alloc(4096, 4 << 20);
    memset(a, 1, 4 << 20);
    memset(b, 2, 4 << 20);
    printf("%5s", "skew");
    for (int z = 0; z < 4; z++) printf(" %8zu %8s", sizes[z], "avx2");
    printf("   (GB/s)\n");
    for (size_t k = 0; k < sizeof skews / sizeof skews[0]; k++) {
        printf("%5d", skews[k]);
        for (int z = 0; z < 4; z++)
            printf(" %8.1f %8.1f", rate(b + 8192 + skews[k], a + 8192, sizes[z], 0), rate(b + 8192 + skews[k], a + 8192, sizes[z], 1));
        printf("\n");
    }
    return 0;
}
