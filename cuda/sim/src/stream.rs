//! Streams: in-order queues, each run by its own worker thread, so that copies, kernels, host
//! functions and event records happen later than the calls that enqueue them (with an optional
//! random delay, `OXCCL_CUDA_SIM_DELAY_US`), as on a GPU. Events complete when their stream
//! reaches them. The first failure of a task is sticky for the whole context, as CUDA's errors
//! from the device are.
//!
//! The legacy default stream (handle 0) synchronises implicitly with blocking streams, as CUDA's
//! does: its work waits for the work enqueued earlier on every blocking stream, and a blocking
//! stream's work waits for the work enqueued earlier on it. Non-blocking streams stand alone.
//!
//! Host functions (`cuLaunchHostFunc`) of every stream run on one thread of the process, one at a
//! time, as CUDA allows ("host functions without a mandated order may be serialized", and the
//! driver does): a host function that blocks holds back every other stream's host functions.

use crate::{Fail, CUDA_ERROR_INVALID_HANDLE};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A unit of work on a stream.
pub type Task = Box<dyn FnOnce() -> Result<(), Fail> + Send>;

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    busy: bool,
    stop: bool,
    capturing: bool,
    /// Tasks enqueued, and tasks finished, since the stream was made.
    pushed: u64,
    done: u64,
}

/// How a stream relates to the legacy default stream (CUDA's implicit synchronisation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// The legacy default stream (handle 0): its work waits for all earlier work of the
    /// blocking streams.
    Legacy,
    /// A stream made without `CU_STREAM_NON_BLOCKING`: its work waits for all earlier work of
    /// the legacy stream.
    Blocking,
    /// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation.
    NonBlocking,
}

/// One stream.
pub struct Stream {
    q: Mutex<Queue>,
    cv: Condvar,
    kind: Kind,
}

static STICKY: Mutex<Option<Fail>> = Mutex::new(None);

/// The first failure of any task (sticky: every later call reports it).
pub fn sticky() -> Option<Fail> {
    STICKY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn record_failure(f: Fail) {
    eprintln!("oxccl-cuda-sim: a device task failed: {} ({})", f.message, crate::error_name(f.code));
    STICKY.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(f);
}

fn delay() {
    let max = crate::config().delay_us;
    if max > 0 {
        // a cheap per-thread xorshift: random, not reproducible, enough to shake orderings
        thread_local!(static X: std::cell::Cell<u64> = std::cell::Cell::new(0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64));
        let r = X.with(|x| {
            let mut v = x.get() ^ (Instant::now().elapsed().as_nanos() as u64);
            v ^= v << 13;
            v ^= v >> 7;
            v ^= v << 17;
            x.set(v);
            v
        });
        std::thread::sleep(Duration::from_micros(r % (max + 1)));
    }
}

impl Stream {
    /// A stream with its worker.
    pub fn new(kind: Kind) -> Arc<Stream> {
        let s = Arc::new(Stream { q: Mutex::new(Queue::default()), cv: Condvar::new(), kind });
        let w = s.clone();
        std::thread::Builder::new()
            .name("cuda-sim-stream".into())
            .spawn(move || w.work())
            .expect("the simulated driver could not start a stream worker");
        s
    }

    fn work(&self) {
        loop {
            let task = {
                let mut q = self.q.lock().unwrap();
                loop {
                    if let Some(t) = q.tasks.pop_front() {
                        q.busy = true;
                        break t;
                    }
                    if q.stop {
                        return;
                    }
                    q = self.cv.wait(q).unwrap();
                }
            };
            delay();
            if sticky().is_none() {
                if let Err(f) = task() {
                    record_failure(f);
                }
            }
            let mut q = self.q.lock().unwrap();
            q.busy = false;
            q.done += 1;
            self.cv.notify_all();
        }
    }

    /// Append a task. On the legacy stream it first waits for the work enqueued so far on every
    /// blocking stream; on a blocking stream, for the work enqueued so far on the legacy stream.
    pub fn push(&self, t: Task) {
        let others: Vec<Arc<Stream>> = match self.kind {
            Kind::NonBlocking => Vec::new(),
            Kind::Legacy => STREAMS
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, s)| s.kind == Kind::Blocking)
                .map(|(_, s)| s.clone())
                .collect(),
            Kind::Blocking => get(0).into_iter().collect(),
        };
        let deps: Vec<(Arc<Stream>, u64)> = others
            .into_iter()
            .map(|s| {
                let k = s.q.lock().unwrap().pushed;
                (s, k)
            })
            .filter(|(_, k)| *k > 0)
            .collect();
        let task: Task = if deps.is_empty() {
            t
        } else {
            Box::new(move || {
                for (s, k) in &deps {
                    s.wait_done(*k)?;
                }
                t()
            })
        };
        let mut q = self.q.lock().unwrap();
        q.tasks.push_back(task);
        q.pushed += 1;
        self.cv.notify_all();
    }

    /// Wait until the first `k` tasks enqueued on this stream have run.
    fn wait_done(&self, k: u64) -> Result<(), Fail> {
        let mut q = self.q.lock().unwrap();
        while q.done < k {
            if let Some(f) = sticky() {
                return Err(f);
            }
            q = self.cv.wait_timeout(q, Duration::from_millis(50)).unwrap().0;
        }
        Ok(())
    }

    /// Wait until every task enqueued so far has run.
    pub fn sync(&self) -> Result<(), Fail> {
        let mut q = self.q.lock().unwrap();
        while q.busy || !q.tasks.is_empty() {
            q = self.cv.wait(q).unwrap();
        }
        drop(q);
        sticky().map_or(Ok(()), Err)
    }

    /// Whether nothing is queued or running.
    pub fn idle(&self) -> bool {
        let q = self.q.lock().unwrap();
        !q.busy && q.tasks.is_empty()
    }

    /// Stop the worker after the queued tasks.
    pub fn stop(&self) {
        self.q.lock().unwrap().stop = true;
        self.cv.notify_all();
    }

    /// Mark the stream as being captured into a graph (or not).
    pub fn set_capturing(&self, on: bool) {
        self.q.lock().unwrap().capturing = on;
    }

    /// Whether it is being captured.
    pub fn capturing(&self) -> bool {
        self.q.lock().unwrap().capturing
    }
}

/// The process's host-function thread: its queue of calls, each with the flag its stream waits on.
type HostCall = (Box<dyn FnOnce() + Send>, Arc<(Mutex<bool>, Condvar)>);
static HOST_CALLS: Mutex<VecDeque<HostCall>> = Mutex::new(VecDeque::new());
static HOST_CV: Condvar = Condvar::new();

/// Run `f` on the process's one host-function thread and wait until it returned (a stream's task
/// calls this: the stream is blocked meanwhile, as CUDA's is).
pub fn host_call(f: Box<dyn FnOnce() + Send>) {
    static THREAD: std::sync::Once = std::sync::Once::new();
    THREAD.call_once(|| {
        std::thread::Builder::new()
            .name("cuda-sim-hostfn".into())
            .spawn(|| loop {
                let (f, done) = {
                    let mut q = HOST_CALLS.lock().unwrap();
                    loop {
                        if let Some(c) = q.pop_front() {
                            break c;
                        }
                        q = HOST_CV.wait(q).unwrap();
                    }
                };
                f();
                *done.0.lock().unwrap() = true;
                done.1.notify_all();
            })
            .expect("the simulated driver could not start its host-function thread");
    });
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    HOST_CALLS.lock().unwrap().push_back((f, done.clone()));
    HOST_CV.notify_all();
    let mut g = done.0.lock().unwrap();
    while !*g {
        g = done.1.wait(g).unwrap();
    }
}

/// Streams by handle; handle 0 is the default (legacy) stream.
static STREAMS: Mutex<Vec<(usize, Arc<Stream>)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x5000_0000);

/// Create a stream (`CU_STREAM_NON_BLOCKING` in `flags`, or blocking); returns its handle.
pub fn create(flags: u32) -> usize {
    let kind = if flags & 1 != 0 { Kind::NonBlocking } else { Kind::Blocking };
    let h = NEXT.fetch_add(0x40, std::sync::atomic::Ordering::Relaxed);
    STREAMS.lock().unwrap().push((h, Stream::new(kind)));
    h
}

/// The stream of a handle (0: the default stream, made on first use).
pub fn get(h: usize) -> Result<Arc<Stream>, Fail> {
    let mut all = STREAMS.lock().unwrap();
    if let Some((_, s)) = all.iter().find(|(k, _)| *k == h) {
        return Ok(s.clone());
    }
    if h == 0 {
        let s = Stream::new(Kind::Legacy);
        all.push((0, s.clone()));
        return Ok(s);
    }
    Err(Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("stream {h:#x} does not exist (never created, or destroyed)")))
}

/// Destroy a stream (its queued work still runs, as in CUDA).
pub fn destroy(h: usize) -> Result<(), Fail> {
    let mut all = STREAMS.lock().unwrap();
    let i = all.iter().position(|(k, _)| *k == h && h != 0).ok_or_else(|| {
        Fail::new(CUDA_ERROR_INVALID_HANDLE, format!("cuStreamDestroy: stream {h:#x} does not exist"))
    })?;
    all.remove(i).1.stop();
    Ok(())
}

/// Wait until every stream is idle (`cuCtxSynchronize`, and what freeing memory implies).
pub fn sync_all() -> Result<(), Fail> {
    let all: Vec<Arc<Stream>> = STREAMS.lock().unwrap().iter().map(|(_, s)| s.clone()).collect();
    for s in all {
        s.sync()?;
    }
    sticky().map_or(Ok(()), Err)
}

/// An event: recorded on a stream, complete when the stream reaches the record.
#[derive(Default)]
pub struct Event {
    state: Mutex<(u64, u64, Option<Instant>)>, // (records made, records reached, time reached)
    cv: Condvar,
}

impl Event {
    /// Record on `s`.
    pub fn record(self: &Arc<Self>, s: &Stream) {
        let n = {
            let mut g = self.state.lock().unwrap();
            g.0 += 1;
            g.0
        };
        let e = self.clone();
        s.push(Box::new(move || {
            let mut g = e.state.lock().unwrap();
            g.1 = g.1.max(n);
            g.2 = Some(Instant::now());
            e.cv.notify_all();
            Ok(())
        }));
    }

    /// Wait for the last record made so far.
    pub fn sync(&self) -> Result<(), Fail> {
        let mut g = self.state.lock().unwrap();
        let want = g.0;
        while g.1 < want {
            if let Some(f) = sticky() {
                return Err(f);
            }
            g = self.cv.wait_timeout(g, Duration::from_millis(50)).unwrap().0;
        }
        Ok(())
    }

    /// Whether the last record made so far was reached.
    pub fn done(&self) -> bool {
        let g = self.state.lock().unwrap();
        g.1 >= g.0
    }

    /// When the last record was reached.
    pub fn time(&self) -> Option<Instant> {
        self.state.lock().unwrap().2
    }
}
