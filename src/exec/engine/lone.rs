//! A lone blocking operation (one op, one communicator: most calls) is first polled inline,
//! under the lock its caller took to prepare it, without queuing it: while the peers keep up,
//! a small message completes within a few polls, and the engine's bookkeeping (slots, send
//! lines, lines of order) is never built. An operation that still waits after
//! [`QUICK_POLLS`] polls, or after one when this thread's spin budget is spent (the peers are
//! not running), goes to the engine ([`super::drive`]) as it stands, which waits for it with
//! the deadlines, reports and sleep of every other wait. No clock is read here.

use super::super::wait::adaptive_spin;
use crate::exec::{Conns, OpRun};
use crate::Result;
use std::time::Duration;

/// Inline polls before the engine takes over (its ladder reads the clock once every 64 idle
/// passes: this is the first such stretch).
pub const QUICK_POLLS: u32 = 63;

/// Poll `run` on `conns` (its communicator's connections, held by the caller) until it
/// completed, at most [`QUICK_POLLS`] times (once if this thread's adapted budget of `spin`
/// is spent), stopping early when `stopped` (abort, revoke). Returns whether it completed: its
/// steps all ran and its sends left the process.
pub fn quick_polls(run: &mut OpRun<'_>, conns: &mut Conns, spin: Duration, stopped: impl Fn() -> bool) -> Result<bool> {
    let polls = if adaptive_spin(spin).is_zero() { 1 } else { QUICK_POLLS };
    for _ in 0..polls {
        if stopped() {
            return Ok(false);
        }
        run.poll(conns)?;
        if run.done() {
            // (the engine's flush, for this op's peers only)
            let mut clear = true;
            for &q in run.sched.peers().1 {
                if let Some(s) = conns.send[q].as_mut() {
                    s.progress().map_err(|e| e.with_peer(q).with_rank(run.rank))?;
                    clear &= !s.pending();
                }
            }
            if clear {
                return Ok(true);
            }
        }
        std::hint::spin_loop();
    }
    Ok(false)
}
