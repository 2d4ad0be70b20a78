//! Namespace hosts for the tests that need separate hosts (`../shared/netns/netns_up.sh`).

use std::path::PathBuf;
use std::process::Command;

/// The shared folder (`OXCCL_SHARED`, or `../shared` beside the repository).
pub fn shared() -> PathBuf {
    std::env::var_os("OXCCL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// The namespace hosts of one test; holding it keeps other tests (which would tear the same
/// hosts down) waiting.
pub struct Hosts(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Hosts {
    pub fn up(n: usize) -> Hosts {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let s = Command::new(shared().join("netns/netns_up.sh"))
            .args(["-n", &n.to_string()])
            .status()
            .expect("netns_up.sh");
        assert!(s.success(), "netns_up.sh failed");
        Hosts(guard)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new(shared().join("netns/netns_down.sh")).status();
    }
}
