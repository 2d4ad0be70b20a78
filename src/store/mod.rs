//! The bootstrap key-value store, and its implementations.
//!
//! Bootstrap (peer discovery, connection setup blobs, split) goes through a [`Store`], as in Gloo
//! and PyTorch. [`TcpStore`] speaks the wire protocol of PyTorch's c10d `TCPStore`, so under
//! torchrun oxccl is a client of torchrun's store on `MASTER_PORT`, and standalone rank 0 serves a
//! compatible one ([`StoreServer`]). With a [`crate::UniqueId`], the server requires every client
//! to prove it knows the id's secret first (a challenge answered with a keyed hash) before it
//! reads anything else; strangers are dropped after [`AUTH_TIMEOUT`] at most.
//! [`MemStore`] serves threads-as-ranks in one process.

mod client;
mod sealed;
mod server;
mod wire;

pub use client::TcpStore;
pub use server::StoreServer;

use crate::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an authenticating client may take.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(2);

/// A bootstrap key-value store.
pub trait Store: Send + Sync {
    /// Set `key` to `value`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Wait (up to `timeout`) for all `keys`, then return their values.
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>>;
    /// Add `delta` to the integer at `key` (0 if absent); returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Whether all `keys` exist, without waiting.
    fn check(&self, keys: &[String]) -> Result<bool>;
    /// Delete `key`; returns whether it existed.
    fn delete(&self, key: &str) -> Result<bool>;
    /// Wait (up to `timeout`) for `key`, then return its value.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        Ok(self.multi_get(&[key.to_string()], timeout)?.remove(0))
    }
    /// Wait up to `timeout` for all `keys`: `true` when they all exist, `false` at the timeout
    /// (for waits in slices, which check other conditions between them).
    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        match self.multi_get(keys, timeout) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::Timeout => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// An in-process store (threads as ranks).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

pub(super) fn store_timeout(keys: &[String], timeout: Duration) -> Error {
    Error::timeout(format!("bootstrap store: keys {keys:?} not set within {:.1} s", timeout.as_secs_f64()))
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map.lock().unwrap().insert(key.to_string(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut g = self.map.lock().unwrap();
        loop {
            if keys.iter().all(|k| g.contains_key(k)) {
                return Ok(keys.iter().map(|k| g[k].clone()).collect());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = keys.iter().filter(|k| !g.contains_key(*k)).cloned().collect();
                return Err(store_timeout(&missing, timeout));
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut g = self.map.lock().unwrap();
        let v = g.get(key).and_then(|b| std::str::from_utf8(b).ok()?.parse::<i64>().ok()).unwrap_or(0) + delta;
        g.insert(key.to_string(), v.to_string().into_bytes());
        self.cv.notify_all();
        Ok(v)
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        let g = self.map.lock().unwrap();
        Ok(keys.iter().all(|k| g.contains_key(k)))
    }
    fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.map.lock().unwrap().remove(key).is_some())
    }
}

/// A store that prepends `prefix/` to every key (PyTorch's `PrefixStore`).
pub struct PrefixStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl PrefixStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Store>, prefix: impl Into<String>) -> Self {
        PrefixStore { inner, prefix: prefix.into() }
    }
    fn k(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.k(key), value)
    }
    fn multi_get(&self, keys: &[String], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.multi_get(&ks, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.k(key), delta)
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.check(&ks)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(&self.k(key))
    }
    fn wait_all(&self, keys: &[String], timeout: Duration) -> Result<bool> {
        let ks: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.inner.wait_all(&ks, timeout)
    }
}

#[cfg(test)]
mod tests;
