//! A blocking call of one operation on one communicator, the common case, runs without a
//! group: nothing to collect, match up or order. One lock prepares it and polls it
//! ([`crate::exec::quick_polls`]); the engine is entered only if it must wait, and the flight
//! recorder notes it then, or when it ends. Same schedule, executor and completion as a
//! group's.

use super::group::{conclude, connect, policy, take};
use super::*;
use crate::exec::{drive, quick_polls, Observe, OpRun};
use crate::select::CallOptions;
use crate::Result;

impl Communicator {
    /// Run one checked operation to completion.
    pub(crate) fn run_one(&self, d: OpDesc, opts: CallOptions, mem: OpMem<'_>) -> Result<()> {
        let sh = &*self.sh;
        let _scope = crate::log::RankScope::new(sh.rank);
        let _guard = self.enter()?;
        sh.wait_async_idle();
        let now = oxccl_simd::clock::now(); // one (unfenced) clock read for the deadline and the flight record
        let mut st = sh.state.lock().unwrap();
        let t = take(sh, &mut st, true, &d, &opts, None)?;
        let mut run = OpRun::new(0, sh.rank, sh.nranks, sh.comm_id, t.seq, t.fp, t.sched, mem);
        run.obs = Observe::new(now, opts.profiler_tag);
        if !t.connected {
            drop(st);
            connect(&[self], std::slice::from_ref(&run))?;
            st = sh.state.lock().unwrap();
        }
        let quick = quick_polls(&mut run, &mut st.conns, sh.spin, || sh.stopped());
        drop(st);
        let res = match quick {
            Ok(true) => Ok(()),
            Ok(false) => {
                sh.record(&mut run);
                drive(&[sh], std::slice::from_mut(&mut run), policy(&[sh], now))
            }
            Err(e) => Err(e),
        };
        conclude(&[sh], std::slice::from_ref(&run), res)
    }
}
