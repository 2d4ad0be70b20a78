// mpi_colls_bench.c - nccl-tests-style MPI benchmark of all-gather, reduce-scatter and broadcast
// (float32), for bench/compare.sh: oxccl's other collectives against Open MPI's, side by side.
// The peers' anchors in ../shared/anchors measure only all-reduce; this follows their output
// format (size count type redop iters time_us algbw busbw #wrong) and nccl-tests' conventions:
//   size = the whole buffer (all-gather: output, reduce-scatter: input, broadcast: buffer);
//   busbw = algbw * (n-1)/n for all-gather and reduce-scatter, algbw for broadcast.
// Build: mpicc -O2 mpi_colls_bench.c -o mpi_colls_bench
// Run:   mpirun -np 2 ./mpi_colls_bench -c allgather|reducescatter|broadcast -s 8,4K,1M [-t 0.25]
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    }
    return (size_t)v;
}

static int coll; // 0 allgather, 1 reducescatter, 2 broadcast
static int nranks, rank;

static void run(float *s, float *r, size_t count) { // count: elements per rank (ag/rs) or total (bc)
    if (coll == 0) MPI_Allgather(s, (int)count, MPI_FLOAT, r, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
    else if (coll == 1) MPI_Reduce_scatter_block(s, r, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else MPI_Bcast(r, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *list = "8,4K,64K,1M,16M,64M,256M", *name = "allgather";
    double target = 0.25;
    int opt;
    while ((opt = getopt(argc, argv, "c:s:t:")) != -1) {
        if (opt == 'c') name = optarg;
        else if (opt == 's') list = optarg;
        else if (opt == 't') target = atof(optarg);
        else { if (rank == 0) fprintf(stderr, "bad option\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    }
    coll = !strcmp(name, "allgather") ? 0 : !strcmp(name, "reducescatter") ? 1 : !strcmp(name, "broadcast") ? 2 : -1;
    if (coll < 0) { if (rank == 0) fprintf(stderr, "unknown collective %s\n", name); MPI_Abort(MPI_COMM_WORLD, 2); }
    size_t sizes[64], maxsz = 0;
    int nsizes = 0;
    char *dup = strdup(list), *tok = strtok(dup, ",");
    while (tok && nsizes < 64) { sizes[nsizes++] = parse_size(tok); tok = strtok(NULL, ","); }
    free(dup);
    for (int i = 0; i < nsizes; i++) {
        size_t unit = 4 * (size_t)nranks; // whole elements per rank
        sizes[i] = sizes[i] < unit ? unit : sizes[i] / unit * unit;
        if (sizes[i] > maxsz) maxsz = sizes[i];
    }
    float *sbuf = aligned_alloc(4096, (maxsz + 4095) & ~(size_t)4095);
    float *rbuf = aligned_alloc(4096, (maxsz + 4095) & ~(size_t)4095);
    memset(sbuf, 0, maxsz);
    memset(rbuf, 0, maxsz);
    if (rank == 0) {
        printf("# mpi_colls_bench: %s, nranks %d, float32\n", name, nranks);
        printf("#%12s %12s %6s %6s %8s %12s %12s %12s %7s\n", "size(B)", "count", "type", "redop", "iters", "time_us",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }
    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes[si], total = bytes / 4, per = total / nranks;
        size_t count = coll == 2 ? total : per;
        // correctness: rank q contributes q+1 (all-gather: block q holds q+1; reduce-scatter: the sum)
        size_t in_n = coll == 1 ? total : coll == 0 ? per : total;
        for (size_t i = 0; i < in_n; i++) sbuf[i] = (float)(rank + 1);
        if (coll == 2) for (size_t i = 0; i < total; i++) rbuf[i] = rank == 0 ? 1.0f : 0.0f;
        run(sbuf, rbuf, count);
        long wrong = 0, gwrong = 0;
        size_t out_n = coll == 0 ? total : coll == 1 ? per : total;
        for (size_t i = 0; i < out_n; i++) {
            float want = coll == 0 ? (float)(i / per + 1) : coll == 1 ? (float)nranks * (nranks + 1) / 2 : 1.0f;
            wrong += rbuf[i] != want;
        }
        MPI_Allreduce(&wrong, &gwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int w = 0; w < 2; w++) run(sbuf, rbuf, count);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int w = 0; w < 3; w++) run(sbuf, rbuf, count);
        double probe = (MPI_Wtime() - t0) / 3;
        int iters = (int)(target / (probe > 1e-9 ? probe : 1e-9));
        if (iters < 3) iters = 3;
        if (iters > 100000) iters = 100000;
        MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) run(sbuf, rbuf, count);
        double dt = (MPI_Wtime() - t0) / iters, sum = 0;
        MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double t = sum / nranks;
        double algbw = bytes / t / 1e9, busbw = coll == 2 ? algbw : algbw * (nranks - 1) / nranks;
        if (rank == 0) {
            printf(" %12zu %12zu %6s %6s %8d %12.2f %12.3f %12.3f %7ld\n", bytes, count, "float",
                   coll == 1 ? "sum" : "none", iters, t * 1e6, algbw, busbw, gwrong);
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
