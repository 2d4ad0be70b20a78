/* oxccl's libfabric shim: libfabric's data-path calls are static inline functions in its
 * headers (calls through each object's ops table), so they are compiled here, against
 * libfabric-dev's headers, into plain functions Rust can call. The few real library functions
 * (fi_getinfo, fi_fabric, ...) are resolved with dlopen("libfabric.so.1") at run time, so no
 * oxccl binary links libfabric: a machine without it gets a clean "unavailable". */
#include <dlfcn.h>
#include <errno.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OXF_MAX_EPS 4

static struct {
  void* lib;
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const struct fi_info*, struct fi_info**);
  void (*freeinfo)(struct fi_info*);
  struct fi_info* (*dupinfo)(const struct fi_info*);
  int (*fabric)(struct fi_fabric_attr*, struct fid_fabric**, void*);
  const char* (*strerror)(int);
} L;

/* 0 when libfabric.so.1 and its entry points are there; otherwise -1 and a message. */
int oxf_load(char* err, size_t errlen) {
  if (L.lib) return 0;
  void* h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "libfabric.so.1 is not installed (%s)", dlerror());
    return -1;
  }
  L.getinfo = (int (*)(uint32_t, const char*, const char*, uint64_t, const struct fi_info*, struct fi_info**))dlsym(h, "fi_getinfo");
  L.freeinfo = (void (*)(struct fi_info*))dlsym(h, "fi_freeinfo");
  L.dupinfo = (struct fi_info * (*)(const struct fi_info*)) dlsym(h, "fi_dupinfo");
  L.fabric = (int (*)(struct fi_fabric_attr*, struct fid_fabric**, void*))dlsym(h, "fi_fabric");
  L.strerror = (const char* (*)(int))dlsym(h, "fi_strerror");
  if (!L.getinfo || !L.freeinfo || !L.dupinfo || !L.fabric || !L.strerror) {
    snprintf(err, errlen, "libfabric.so.1 lacks fi_getinfo/fi_fabric (too old?)");
    dlclose(h);
    return -1;
  }
  L.lib = h;
  return 0;
}

const char* oxf_strerror(int e) { return L.strerror ? L.strerror(e < 0 ? -e : e) : "libfabric not loaded"; }

struct oxf_ctx {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_ep* ep[OXF_MAX_EPS]; /* endpoints sharing one AV and one CQ (striping) */
  int neps;
  int wait_fd;
  int virt_addr; /* remote addresses are virtual addresses (else offsets into the region) */
  int mr_local;  /* local buffers need a registration descriptor */
  char prov[64];
  char domain_name[64];
};

#define TRY(call, what)                                                                  \
  do {                                                                                   \
    int r_ = (int)(call);                                                                \
    if (r_) {                                                                            \
      snprintf(err, errlen, "%s failed: %s (%d)", what, L.strerror(-r_), r_);            \
      oxf_destroy(c);                                                                    \
      return NULL;                                                                       \
    }                                                                                    \
  } while (0)

void oxf_destroy(struct oxf_ctx* c) {
  if (!c) return;
  for (int i = 0; i < OXF_MAX_EPS; i++)
    if (c->ep[i]) fi_close(&c->ep[i]->fid);
  if (c->av) fi_close(&c->av->fid);
  if (c->cq) fi_close(&c->cq->fid);
  if (c->domain) fi_close(&c->domain->fid);
  if (c->fabric) fi_close(&c->fabric->fid);
  if (c->info) L.freeinfo(c->info);
  free(c);
}

/* `neps` RDM endpoints of `provider` (e.g. "tcp;ofi_rxm"; NULL: any) bound to `node` (a local
 * IP or NULL), with RMA write, messages, send-after-write ordering, sharing one address vector
 * and one CQ that has a file descriptor to sleep on. */
struct oxf_ctx* oxf_create(const char* provider, const char* node, int neps, char* err, size_t errlen) {
  if (oxf_load(err, errlen)) return NULL;
  struct oxf_ctx* c = calloc(1, sizeof *c);
  struct fi_info* hints = L.dupinfo(NULL);
  if (!c || !hints) {
    snprintf(err, errlen, "out of memory");
    free(c);
    return NULL;
  }
  c->wait_fd = -1;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  hints->mode = 0; /* contexts are plain tokens: no FI_CONTEXT memory */
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->tx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAW | FI_ORDER_SAS;
  if (provider && *provider) hints->fabric_attr->prov_name = strdup(provider);
  int r = L.getinfo(FI_VERSION(1, 9), node, NULL, node ? FI_SOURCE : 0, hints, &c->info);
  L.freeinfo(hints);
  if (r || !c->info) {
    snprintf(err, errlen, "fi_getinfo(provider %s, node %s) found no RDM endpoint with RMA: %s", provider ? provider : "any",
             node ? node : "any", L.strerror(-r));
    c->info = NULL;
    oxf_destroy(c);
    return NULL;
  }
  snprintf(c->prov, sizeof c->prov, "%s", c->info->fabric_attr->prov_name ? c->info->fabric_attr->prov_name : "?");
  snprintf(c->domain_name, sizeof c->domain_name, "%s", c->info->domain_attr->name ? c->info->domain_attr->name : "?");
  c->virt_addr = (c->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  c->mr_local = (c->info->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
  TRY(L.fabric(c->info->fabric_attr, &c->fabric, NULL), "fi_fabric");
  TRY(fi_domain(c->fabric, c->info, &c->domain, NULL), "fi_domain");
  struct fi_cq_attr cq_attr = {0};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_FD;
  cq_attr.size = 4096;
  TRY(fi_cq_open(c->domain, &cq_attr, &c->cq, NULL), "fi_cq_open");
  TRY(fi_control(&c->cq->fid, FI_GETWAIT, &c->wait_fd), "fi_control(FI_GETWAIT)");
  struct fi_av_attr av_attr = {0};
  av_attr.type = FI_AV_TABLE;
  TRY(fi_av_open(c->domain, &av_attr, &c->av, NULL), "fi_av_open");
  if (neps < 1 || neps > OXF_MAX_EPS) {
    snprintf(err, errlen, "%d endpoints asked for (1..%d)", neps, OXF_MAX_EPS);
    oxf_destroy(c);
    return NULL;
  }
  if (neps > 1 && (c->info->domain_attr->mr_mode & FI_MR_ENDPOINT)) {
    snprintf(err, errlen, "provider %s binds registrations to one endpoint: use one endpoint per rank", c->prov);
    oxf_destroy(c);
    return NULL;
  }
  for (int i = 0; i < neps; i++) {
    TRY(fi_endpoint(c->domain, c->info, &c->ep[i], NULL), "fi_endpoint");
    TRY(fi_ep_bind(c->ep[i], &c->av->fid, 0), "fi_ep_bind(av)");
    TRY(fi_ep_bind(c->ep[i], &c->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    TRY(fi_enable(c->ep[i]), "fi_enable");
  }
  c->neps = neps;
  return c;
}

const char* oxf_provider(struct oxf_ctx* c) { return c->prov; }
const char* oxf_domain(struct oxf_ctx* c) { return c->domain_name; }
int oxf_virt_addr(struct oxf_ctx* c) { return c->virt_addr; }
int oxf_wait_fd(struct oxf_ctx* c) { return c->wait_fd; }

int oxf_getname(struct oxf_ctx* c, int ep, void* buf, size_t* len) { return fi_getname(&c->ep[ep]->fid, buf, len); }

int oxf_av_insert(struct oxf_ctx* c, const void* addr, uint64_t* out) {
  fi_addr_t a = FI_ADDR_UNSPEC;
  int n = fi_av_insert(c->av, addr, 1, &a, 0, NULL);
  if (n != 1) return n < 0 ? n : -FI_EINVAL;
  *out = a;
  return 0;
}

/* Register [buf, buf+len) for local use and remote writes. */
int oxf_mr_reg(struct oxf_ctx* c, void* buf, size_t len, void** mr_out, void** desc, uint64_t* key) {
  struct fid_mr* mr = NULL;
  /* without FI_MR_PROV_KEY the application picks keys, unique within the domain */
  static uint64_t next_key = 1;
  uint64_t want = (c->info->domain_attr->mr_mode & FI_MR_PROV_KEY) ? 0 : __atomic_fetch_add(&next_key, 1, __ATOMIC_RELAXED);
  int r = fi_mr_reg(c->domain, buf, len, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0, want, 0, &mr, NULL);
  if (r) return r;
  if (c->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    r = fi_mr_bind(mr, &c->ep[0]->fid, 0);
    if (!r) r = fi_mr_enable(mr);
    if (r) {
      fi_close(&mr->fid);
      return r;
    }
  }
  *mr_out = mr;
  *desc = fi_mr_desc(mr);
  *key = fi_mr_key(mr);
  return 0;
}

void oxf_mr_close(void* mr) {
  if (mr) fi_close(&((struct fid_mr*)mr)->fid);
}

/* The data path: each returns 0, -FI_EAGAIN (retry after progress) or another negative error. */
ssize_t oxf_write(struct oxf_ctx* c, int ep, const void* buf, size_t len, void* desc, uint64_t dest, uint64_t raddr,
                  uint64_t key, void* ctx) {
  return fi_write(c->ep[ep], buf, len, desc, dest, raddr, key, ctx);
}
/* A write whose target gets a completion carrying `data` (remote CQ data): the write and its
 * notification in one operation. */
ssize_t oxf_write_data(struct oxf_ctx* c, int ep, const void* buf, size_t len, void* desc, uint64_t data, uint64_t dest,
                       uint64_t raddr, uint64_t key, void* ctx) {
  return fi_writedata(c->ep[ep], buf, len, desc, data, dest, raddr, key, ctx);
}
/* Bytes of remote CQ data the domain carries (0: none). */
size_t oxf_cq_data_size(struct oxf_ctx* c) { return c->info->domain_attr->cq_data_size; }
ssize_t oxf_send(struct oxf_ctx* c, int ep, const void* buf, size_t len, void* desc, uint64_t dest, void* ctx) {
  return fi_send(c->ep[ep], buf, len, desc, dest, ctx);
}
ssize_t oxf_recv(struct oxf_ctx* c, int ep, void* buf, size_t len, void* desc, void* ctx) {
  return fi_recv(c->ep[ep], buf, len, desc, FI_ADDR_UNSPEC, ctx);
}

/* One completion, in a layout Rust declares too. */
struct oxf_cqe {
  void* ctx;
  uint64_t flags;
  uint64_t len;
  int32_t err; /* 0, or a positive FI_* error number */
  int32_t prov_errno;
  uint64_t data; /* remote CQ data, with FI_REMOTE_CQ_DATA in flags */
};

/* Up to n completions: >= 0 entries read (0: none), or a negative error of the CQ itself. An
 * error completion comes back as one entry with `err` set. */
ssize_t oxf_cq_read(struct oxf_ctx* c, struct oxf_cqe* out, size_t n) {
  struct fi_cq_data_entry e[16];
  if (n > 16) n = 16;
  ssize_t r = fi_cq_read(c->cq, e, n);
  if (r == -FI_EAGAIN) return 0;
  if (r == -FI_EAVAIL) {
    struct fi_cq_err_entry ee;
    memset(&ee, 0, sizeof ee);
    ssize_t k = fi_cq_readerr(c->cq, &ee, 0);
    if (k < 0) return k == -FI_EAGAIN ? 0 : k;
    out[0].ctx = ee.op_context;
    out[0].flags = ee.flags;
    out[0].len = ee.len;
    out[0].err = ee.err ? ee.err : FI_EOTHER;
    out[0].prov_errno = ee.prov_errno;
    out[0].data = 0;
    return 1;
  }
  if (r < 0) return r;
  for (ssize_t i = 0; i < r; i++) {
    out[i].ctx = e[i].op_context;
    out[i].flags = e[i].flags;
    out[i].len = e[i].len;
    out[i].err = 0;
    out[i].prov_errno = 0;
    out[i].data = e[i].data;
  }
  return r;
}

/* 0 when it is safe to sleep on the wait fd (nothing is pending), -FI_EAGAIN otherwise. */
int oxf_trywait(struct oxf_ctx* c) {
  struct fid* f = &c->cq->fid;
  return fi_trywait(c->fabric, &f, 1);
}

int oxf_eagain(void) { return -FI_EAGAIN; }
uint64_t oxf_flag_recv(void) { return FI_RECV; }
uint64_t oxf_flag_remote_cq_data(void) { return FI_REMOTE_CQ_DATA; }
