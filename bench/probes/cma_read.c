// cma_read.c - what a single copy between processes costs here: process_vm_readv(2) of a buffer
// in another process (Linux CMA, what oxccl's shared-memory transport and Open MPI's vader use
// to copy once), against memcpy of the same buffer within one process. Both buffers are hot;
// the child only holds its memory (pause). Prints µs per call and GB/s per size.
// Build: gcc -O2 cma_read.c -o cma_read     Run: ./cma_read
#define _GNU_SOURCE
#include <sys/uio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(void){
  size_t sizes[]={4096,65536,262144,1<<20,16<<20};
  for(int k=0;k<5;k++){ size_t n=sizes[k];
    char*src=aligned_alloc(4096,n); memset(src,1,n); char*dst=aligned_alloc(4096,n); memset(dst,0,n);
    pid_t p=fork(); if(!p){ pause(); _exit(0);} 
    int it = n<=65536?20000:(n<=1<<20?2000:100);
    struct iovec l={dst,n}, r={src,n};
    for(int i=0;i<10;i++) process_vm_readv(p,&l,1,&r,1,0);
    double t0=now(); for(int i=0;i<it;i++) if(process_vm_readv(p,&l,1,&r,1,0)!=(ssize_t)n){perror("cma");return 1;}
    double t1=now(); for(int i=0;i<it;i++) memcpy(dst,src,n); double t2=now();
    printf("%8zu cma %.2f us (%.1f GB/s)  memcpy %.2f us (%.1f GB/s)\n", n,(t1-t0)/it, n/((t1-t0)/it)/1e3,(t2-t1)/it,n/((t2-t1)/it)/1e3);
    kill(p,9); waitpid(p,0,0); }
}
