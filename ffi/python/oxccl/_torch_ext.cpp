// The "oxccl" torch.distributed backend's C++ shell: a c10d::Backend and a c10d::Work.
//
// Why C++ at all: torch wraps every Work that a Python backend returns in a holder that forwards
// only wait() and get_future(), so is_completed(), is_success(), exception() and source_rank()
// of a Python Work are never seen. A c10d::Backend written in C++ returns its own Work, whose
// virtual methods torch calls directly. The collectives themselves stay in Python (oxccl/torch.py,
// over the C ABI): each method here takes the GIL, calls the Python object's method of the same
// name, and returns the Work it made. Built against the user's torch, at install or first import.
#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using c10d::Work;
using std::vector;
using Tensors = vector<at::Tensor>;
using TensorLists = vector<vector<at::Tensor>>;

namespace {

// Whether Python may run here: not before initialization, nor once finalization began. A
// non-main thread that takes the GIL during finalization is ended with pthread_exit, and that
// unwinding through a C++ destructor (noexcept) aborts the process ("terminate called without
// an active exception").
bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

std::exception_ptr dist_error(const std::string& msg) {
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

// One operation: completed by the backend's Python worker through complete().
class OxWork : public Work {
 public:
  OxWork(int rank, Tensors result, int64_t timeout_ms, bool any_source, std::string what)
      : Work(rank, c10d::OpType::UNKNOWN),
        result_(std::move(result)),
        timeout_(timeout_ms),
        any_source_(any_source),
        what_(std::move(what)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()),
            devices(result_))) {}

  // error empty: success. source: the rank an any-source receive matched.
  // The future first, then the waiters: a caller that wait()ed may read get_future().value()
  // at once (the other order failed torch's completed() assertion in CI).
  void complete(const std::optional<std::string>& error, int source) {
    source_.store(source);
    if (error) {
      auto ep = dist_error(*error);
      future_->setError(ep);
      finish(ep);
    } else {
      future_->markCompleted(c10::IValue(result_));
      finish();
    }
  }

  bool wait(std::chrono::milliseconds timeout) override {
    // no timeout given: the group's (the communicator bounds every wait by it and fails the
    // operation with its own report; this is the backstop)
    auto limit = timeout.count() > 0 ? timeout : timeout_ + std::chrono::milliseconds(2000);
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, limit, [this] { return completed_; })) {
      C10_THROW_ERROR(
          DistBackendError,
          "oxccl: Timed out after " + std::to_string(limit.count()) + " ms waiting for " + what_ +
              " to complete (the operation goes on; the communicator's own timeout fails it)");
    }
    if (exception_) {
      std::rethrow_exception(exception_);
    }
    return true;
  }

  // torch's base answers true while the work is pending; "completed successfully" it is not
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ && !exception_;
  }

  int sourceRank() const override {
    TORCH_CHECK(any_source_, "sourceRank() may only be called on a recv from any source");
    TORCH_CHECK(source_.load() >= 0, "sourceRank(): the receive has not completed");
    return source_.load();
  }

  Tensors result() override {
    return result_;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

  // no `override`: c10d::Work declares getTimeout() in newer torch only (2.11 has none), and
  // this overrides it wherever it exists
  std::chrono::milliseconds getTimeout() const {
    return timeout_;
  }

 private:
  static vector<c10::Device> devices(const Tensors& ts) {
    vector<c10::Device> out;
    for (const auto& t : ts) {
      if (t.defined() && !t.device().is_cpu() &&
          std::find(out.begin(), out.end(), t.device()) == out.end()) {
        out.push_back(t.device());
      }
    }
    return out;
  }

  Tensors result_;
  std::chrono::milliseconds timeout_;
  bool any_source_;
  std::string what_;
  std::atomic<int> source_{-1};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

int64_t ms(std::chrono::milliseconds t) {
  return t.count();
}

// Whether the caller waits at once (torch >= 2.7 says so in asyncOp; older torch: assume not)
template <class O>
auto blocking_of(const O& o, int) -> decltype(o.asyncOp, bool()) {
  return !o.asyncOp;
}
template <class O>
bool blocking_of(const O&, long) {
  return false;
}

// Sets impl._blocking for one call, and clears it however the call ends (GIL held)
struct BlockingScope {
  BlockingScope(py::object& impl, bool blocking) : impl_(impl) {
    PyObject_SetAttrString(impl_.ptr(), "_blocking", blocking ? Py_True : Py_False);
  }
  ~BlockingScope() {
    if (PyObject_SetAttrString(impl_.ptr(), "_blocking", Py_False) != 0) {
      PyErr_Clear();
    }
  }
  py::object& impl_;
};

// Calls the Python implementation's method `name` with the GIL held; returns its Work.
#define OX_CALL(name, ...)                                       \
  do {                                                           \
    py::gil_scoped_acquire gil;                                  \
    py::object w = impl_.attr(name)(__VA_ARGS__);                \
    return w.cast<c10::intrusive_ptr<Work>>();                   \
  } while (false)

// The same, telling the implementation first whether the caller blocks on the result (then an
// idle backend runs it in the calling thread: no hand-off to the worker and back)
#define OX_CALL_O(name, o, ...)                                   \
  do {                                                           \
    py::gil_scoped_acquire gil;                                  \
    BlockingScope scope(impl_, blocking_of(o, 0));               \
    py::object w = impl_.attr(name)(__VA_ARGS__);                \
    return w.cast<c10::intrusive_ptr<Work>>();                   \
  } while (false)

class OxBackend : public c10d::Backend {
 public:
  OxBackend(int rank, int size, py::object impl) : Backend(rank, size), impl_(std::move(impl)) {}

  ~OxBackend() override {
    if (python_usable()) {
      py::gil_scoped_acquire gil;
      impl_ = py::object();
    } else {
      impl_.release();  // the interpreter is gone or going: nothing to free it with
    }
  }

  const std::string getBackendName() const override {
    return "oxccl";
  }
  bool supportsCoalescing() const override {
    return true;
  }

  // one per collective, in issue order, the same on every rank (point-to-point does not count:
  // TORCH_DISTRIBUTED_DEBUG=DETAIL compares it across ranks before each collective)
  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }
  void setSequenceNumberForGroup() override {}

  c10::intrusive_ptr<Work> broadcast(Tensors& t, const c10d::BroadcastOptions& o) override {
    seq_++;
    OX_CALL_O("broadcast", o, t, o.rootRank, o.rootTensor, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allreduce(Tensors& t, const c10d::AllreduceOptions& o) override {
    seq_++;
    OX_CALL_O("allreduce", o, t, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allreduce_sparse(Tensors& t, const c10d::AllreduceOptions& o) override {
    seq_++;
    OX_CALL_O("allreduce_sparse", o, t, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allreduce_coalesced(
      Tensors& t,
      const c10d::AllreduceCoalescedOptions& o) override {
    seq_++;
    OX_CALL_O("allreduce_coalesced", o, t, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> reduce(Tensors& t, const c10d::ReduceOptions& o) override {
    seq_++;
    OX_CALL_O("reduce", o, t, o.reduceOp, o.rootRank, o.rootTensor, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allgather(TensorLists& out, Tensors& in, const c10d::AllgatherOptions& o)
      override {
    seq_++;
    OX_CALL_O("allgather", o, out, in, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> _allgather_base(
      at::Tensor& out,
      at::Tensor& in,
      const c10d::AllgatherOptions& o) override {
    seq_++;
    OX_CALL_O("allgather_base", o, out, in, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allgather_coalesced(
      TensorLists& out,
      Tensors& in,
      const c10d::AllgatherOptions& o) override {
    seq_++;
    OX_CALL_O("allgather_coalesced", o, out, in, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(
      Tensors& out,
      Tensors& in,
      const c10d::AllgatherOptions& o) override {
    seq_++;
    OX_CALL_O("allgather_into_tensor_coalesced", o, out, in, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> gather(TensorLists& out, Tensors& in, const c10d::GatherOptions& o)
      override {
    seq_++;
    OX_CALL_O("gather", o, out, in, o.rootRank, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> scatter(Tensors& out, TensorLists& in, const c10d::ScatterOptions& o)
      override {
    seq_++;
    OX_CALL_O("scatter", o, out, in, o.rootRank, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> reduce_scatter(
      Tensors& out,
      TensorLists& in,
      const c10d::ReduceScatterOptions& o) override {
    seq_++;
    OX_CALL_O("reduce_scatter", o, out, in, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> _reduce_scatter_base(
      at::Tensor& out,
      at::Tensor& in,
      const c10d::ReduceScatterOptions& o) override {
    seq_++;
    OX_CALL_O("reduce_scatter_base", o, out, in, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(
      Tensors& out,
      Tensors& in,
      const c10d::ReduceScatterOptions& o) override {
    seq_++;
    OX_CALL_O("reduce_scatter_tensor_coalesced", o, out, in, o.reduceOp, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> alltoall_base(
      at::Tensor& out,
      at::Tensor& in,
      vector<int64_t>& out_splits,
      vector<int64_t>& in_splits,
      const c10d::AllToAllOptions& o) override {
    seq_++;
    OX_CALL_O("alltoall_base", o, out, in, out_splits, in_splits, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> alltoall(Tensors& out, Tensors& in, const c10d::AllToAllOptions& o)
      override {
    seq_++;
    OX_CALL_O("alltoall", o, out, in, ms(o.timeout));
  }
  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions& o) override {
    seq_++;
    OX_CALL_O("barrier", o, ms(o.timeout));
  }
  // gloo's semantics (rank 0 names the ranks that did not arrive in time), through the store
  void monitoredBarrier(const c10d::BarrierOptions& o, bool waitAllRanks) override {
    py::gil_scoped_acquire gil;
    impl_.attr("monitored_barrier")(ms(o.timeout), waitAllRanks);
  }
  c10::intrusive_ptr<Work> send(Tensors& t, int dst, int tag) override {
    OX_CALL("send", t, dst, tag);
  }
  c10::intrusive_ptr<Work> recv(Tensors& t, int src, int tag) override {
    OX_CALL("recv", t, src, tag);
  }
  c10::intrusive_ptr<Work> recvAnysource(Tensors& t, int tag) override {
    OX_CALL("recv_anysource", t, tag);
  }
  void startCoalescing() override {
    py::gil_scoped_acquire gil;
    impl_.attr("start_coalescing")();
  }
  c10::intrusive_ptr<Work> endCoalescing() override {
    OX_CALL("end_coalescing");
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    impl_.attr("set_timeout")(ms(timeout));
  }
  void abort() override {
    if (!python_usable()) {
      return;  // at exit: the process's end closes the communicator's connections
    }
    py::gil_scoped_acquire gil;
    impl_.attr("abort")();
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  // dist.shrink_group: only the ranks that stay call it; a new backend of those ranks
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks,
      int flags,
      const c10::intrusive_ptr<Options>& /*opts_override*/) override {
    py::gil_scoped_acquire gil;
    py::object impl = impl_.attr("shrink")(ranks, flags);
    return c10::make_intrusive<OxBackend>(impl.attr("rank")().cast<int>(), impl.attr("size")().cast<int>(), impl);
  }
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
  // dist._reconfigure: a handle per rank, exchanged out of band; a new communicator per uuid
  bool supportsReconfigure() const override {
    return true;
  }
  c10d::ReconfigureHandle get_reconfigure_handle() const override {
    py::gil_scoped_acquire gil;
    return impl_.attr("get_reconfigure_handle")().cast<std::string>();
  }
  c10::intrusive_ptr<Work> reconfigure(const c10d::ReconfigureOptions& o) override {
    py::gil_scoped_acquire gil;
    py::list handles;
    bool ordered = std::holds_alternative<std::vector<std::string>>(o.handles);
    if (ordered) {
      for (const auto& h : std::get<std::vector<std::string>>(o.handles)) handles.append(h);
    } else {
      for (const auto& h : std::get<std::unordered_set<std::string>>(o.handles)) handles.append(h);
    }
    int64_t timeout_ms = o.timeout ? o.timeout->count() : -1;
    py::object w = impl_.attr("reconfigure")(o.uuid, handles, ordered, timeout_ms);
    rank_ = impl_.attr("rank")().cast<int>();
    size_ = impl_.attr("size")().cast<int>();
    return w.cast<c10::intrusive_ptr<Work>>();
  }
#endif
  // torchft's errored(): the first failure of this group's operations, as c10d's ErrorType
  c10d::ErrorType getError() override {
    py::gil_scoped_acquire gil;
    return static_cast<c10d::ErrorType>(impl_.attr("error_type")().cast<int>());
  }
  void shutdown() override {
    if (!python_usable()) {
      return;  // at exit: the process's end closes the communicator's connections
    }
    py::gil_scoped_acquire gil;
    impl_.attr("shutdown")();
  }

  // the Python implementation (for tests and the package's own use)
  py::object impl() const {
    return impl_;
  }

 private:
  py::object impl_;
  std::atomic<uint64_t> seq_{0};
};

OxWork& as_ox(Work& w) {
  auto* ox = dynamic_cast<OxWork*>(&w);
  TORCH_CHECK(ox != nullptr, "oxccl: not a Work made by the oxccl backend");
  return *ox;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module::import("torch.distributed");
  m.doc() = "The oxccl torch.distributed backend's C++ Backend and Work (see oxccl/torch.py)";
  m.def(
      "new_backend",
      [](int rank, int size, py::object impl) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<OxBackend>(rank, size, std::move(impl));
      },
      "A c10d Backend whose operations call impl's methods");
  m.def(
      "backend_impl",
      [](c10d::Backend& b) -> py::object {
        auto* ox = dynamic_cast<OxBackend*>(&b);
        TORCH_CHECK(ox != nullptr, "oxccl: not an oxccl backend");
        return ox->impl();
      },
      "The Python implementation behind an oxccl Backend");
  m.def(
      "new_work",
      [](int rank, Tensors result, int64_t timeout_ms, bool any_source, std::string what)
          -> c10::intrusive_ptr<Work> {
        return c10::make_intrusive<OxWork>(
            rank, std::move(result), timeout_ms, any_source, std::move(what));
      },
      "A Work completed later by complete()");
  m.def(
      "complete",
      [](Work& w, std::optional<std::string> error, int source) {
        as_ox(w).complete(error, source);
      },
      py::arg("work"),
      py::arg("error") = py::none(),
      py::arg("source") = -1,
      py::call_guard<py::gil_scoped_release>(),
      "Marks a Work done (error: None on success), waking its waiters and its future");
}
