/* Shared helpers of oxccl's C tests: exact data for every type, checks, fork-based ranks. */
#ifndef OXCCL_C_TEST_COMMON_H
#define OXCCL_C_TEST_COMMON_H
#include "nccl.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_rank = -1;

#define CHECK(cmd)                                                                                     \
  do {                                                                                                 \
    ncclResult_t r_ = (cmd);                                                                           \
    if (r_ != ncclSuccess) {                                                                           \
      fprintf(stderr, "rank %d: %s failed: %s [%s] (line %d)\n", g_rank, #cmd, ncclGetErrorString(r_), \
              ncclGetLastError(NULL), __LINE__);                                                       \
      exit(1);                                                                                         \
    }                                                                                                  \
  } while (0)

#define EXPECT(cond, ...)                                                 \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: line %d: %s: ", g_rank, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

__attribute__((unused)) static const int kTypes[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                             ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
__attribute__((unused)) static const char* kTypeNames[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                   "half", "float", "double", "bfloat16", "e4m3", "e5m2"};
#define NTYPES 12

static inline size_t type_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Encode a value that the format represents exactly (small integers, halves): bits. */
static inline uint32_t enc_float(double v, int ebits, int mbits, int bias) {
  uint32_t s = v < 0;
  if (s) v = -v;
  if (v == 0) return s << (ebits + mbits);
  int e;
  double f = frexp(v, &e); /* v = f * 2^e, f in [0.5, 1) */
  uint32_t E = (uint32_t)(e - 1 + bias);
  uint32_t m = (uint32_t)((f * 2 - 1) * (double)(1u << mbits));
  return (s << (ebits + mbits)) | (E << mbits) | m;
}

/* Store the exact value v as element i of type t. */
static inline void put_val(void* p, int t, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)p)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float*)p)[i] = (float)v; break;
    case ncclFloat64: ((double*)p)[i] = v; break;
    case ncclFloat16: ((uint16_t*)p)[i] = (uint16_t)enc_float(v, 5, 10, 15); break;
    case ncclBfloat16: ((uint16_t*)p)[i] = (uint16_t)enc_float(v, 8, 7, 127); break;
    case ncclFloat8e4m3: ((uint8_t*)p)[i] = (uint8_t)enc_float(v, 4, 3, 7); break;
    case ncclFloat8e5m2: ((uint8_t*)p)[i] = (uint8_t)enc_float(v, 5, 2, 15); break;
  }
}

/* Compare n elements bit for bit with the expected values; returns the number that differ. */
static inline size_t count_wrong(const void* got, int t, size_t n, double (*want)(size_t, void*), void* ctx) {
  size_t es = type_size(t), bad = 0;
  unsigned char tmp[8];
  for (size_t i = 0; i < n; i++) {
    put_val(tmp, t, 0, want(i, ctx));
    if (memcmp((const char*)got + i * es, tmp, es) != 0) bad++;
  }
  return bad;
}

/* Fork nranks processes running body(rank, nranks, id); rank 0 makes the unique id and passes
 * it to the others through pipes. Returns 0 when every rank exits 0. */
static inline int run_ranks(int nranks, void (*body)(int, int, ncclUniqueId)) {
  int pipes[64][2];
  pid_t pids[64];
  for (int r = 1; r < nranks; r++)
    if (pipe(pipes[r]) != 0) return perror("pipe"), 1;
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      g_rank = r;
      ncclUniqueId id;
      if (r == 0) {
        CHECK(ncclGetUniqueId(&id));
        for (int q = 1; q < nranks; q++)
          if (write(pipes[q][1], &id, sizeof id) != (ssize_t)sizeof id) exit(3);
      } else {
        size_t got = 0;
        while (got < sizeof id) {
          ssize_t k = read(pipes[r][0], (char*)&id + got, sizeof id - got);
          if (k <= 0) exit(3);
          got += (size_t)k;
        }
      }
      body(r, nranks, id);
      exit(0);
    }
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, st);
      failed = 1;
    }
  }
  return failed;
}
#endif
