//! How fast the kernel's copy between processes (`process_vm_readv`) runs against `memcpy` on
//! this machine, measured once per process.
//!
//! Sending an operation's input by reference saves the sender a copy into a slot but makes the
//! receiver read through the kernel, which pins the sender's pages for every read. Where that
//! read runs at a good fraction of memcpy's speed the saved copy wins; where it runs at a
//! quarter or a third (an AMD EPYC VM: 8–13 GB/s against 25–45) two copies through the slots
//! are faster between close cores once they pipeline (from two messages on; one message still
//! goes by reference, `NEAR_FORWARD_MAX_OP`), and slower between cores far apart
//! (`placement.rs` tells which; bench/RESULTS.md "Copies whose buffers are not aligned alike").
//! The caller decides with [`CopyProbe::forward_pays`].

use crate::segment::read_remote;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bytes copied per timed round: four reads of one default slot (256 KiB), as a receiver of a
/// 1 MiB operation reads them.
const PROBE_BYTES: usize = 1 << 20;
const PIECE: usize = 256 << 10;
/// Timed rounds of each copy; the fastest counts (another process may take the core in one).
const ROUNDS: usize = 5;

/// Below this ratio of the kernel's copy speed to memcpy's, sending by reference loses: the
/// machines measured so far read at 0.55–0.69 of memcpy and won, one at 0.27–0.29 lost
/// (bench/RESULTS.md).
pub const FORWARD_MIN_RATIO: f64 = 0.45;

/// The speeds of the two copies, in bytes per second, or `None` where the kernel refuses.
#[derive(Debug, Clone, Copy)]
pub struct CopyProbe {
    /// `process_vm_readv` from this process's own memory, in 256 KiB reads.
    pub kernel: Option<f64>,
    /// `memcpy` of the same bytes, in the same pieces.
    pub memcpy: f64,
}

impl CopyProbe {
    /// The kernel's copy speed as a fraction of memcpy's (0 where it is refused).
    pub fn ratio(&self) -> f64 {
        self.kernel.map_or(0.0, |k| k / self.memcpy)
    }

    /// Whether sending inputs by reference pays here at all ([`FORWARD_MIN_RATIO`]).
    pub fn forward_pays(&self) -> bool {
        self.ratio() >= FORWARD_MIN_RATIO
    }
}

/// The probe of this process, run on the first call (about a millisecond).
pub fn copy_probe() -> CopyProbe {
    static PROBE: OnceLock<CopyProbe> = OnceLock::new();
    *PROBE.get_or_init(measure)
}

fn measure() -> CopyProbe {
    let src: Vec<u8> = (0..PROBE_BYTES).map(|i| i as u8).collect();
    let mut dst = vec![0u8; PROBE_BYTES];
    let pid = std::process::id();
    let kernel_once = |dst: &mut [u8]| -> std::io::Result<Duration> {
        let t = Instant::now();
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            read_remote(pid, s.as_ptr() as usize, d)?;
        }
        Ok(t.elapsed())
    };
    let memcpy_once = |dst: &mut [u8]| {
        let t = Instant::now();
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(std::hint::black_box(s));
        }
        std::hint::black_box(&dst[..]);
        t.elapsed()
    };
    // one untimed round each (page faults, the caches), then interleaved timed rounds
    let mut kernel = kernel_once(&mut dst).ok().map(|_| Duration::MAX);
    memcpy_once(&mut dst);
    let mut memcpy = Duration::MAX;
    for _ in 0..ROUNDS {
        if let Some(best) = kernel.as_mut() {
            match kernel_once(&mut dst) {
                Ok(t) => *best = (*best).min(t),
                Err(_) => kernel = None,
            }
        }
        memcpy = memcpy.min(memcpy_once(&mut dst));
    }
    let rate = |t: Duration| PROBE_BYTES as f64 / t.as_secs_f64().max(1e-9);
    CopyProbe { kernel: kernel.map(rate), memcpy: rate(memcpy) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe measures both copies (a process may always read its own memory) and runs
    /// once: a second call returns the same figures.
    #[test]
    fn the_probe_measures_both_copies_once() {
        let p = copy_probe();
        let k = p.kernel.expect("process_vm_readv of this process's own memory");
        assert!(k > 0.0 && p.memcpy > 0.0 && k.is_finite() && p.memcpy.is_finite());
        assert_eq!(p.ratio(), k / p.memcpy);
        let q = copy_probe();
        assert_eq!((q.kernel, q.memcpy), (p.kernel, p.memcpy));
    }

    /// The verdict follows the ratio; a refused kernel copy never pays.
    #[test]
    fn forwarding_pays_from_the_ratio_on() {
        let at = |kernel: Option<f64>| CopyProbe { kernel, memcpy: 40e9 };
        assert!(at(Some(40e9 * FORWARD_MIN_RATIO)).forward_pays());
        assert!(!at(Some(40e9 * FORWARD_MIN_RATIO * 0.99)).forward_pays());
        assert!(!at(None).forward_pays() && at(None).ratio() == 0.0);
    }
}
