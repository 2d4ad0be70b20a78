//! The unique id: its layout, making one (with the root's store), and reading it back.

use super::*;

/// Bytes of a [`UniqueId`] (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 4] = b"OXID";
const ID_VERSION: u8 = 1;

/// The 128 opaque bytes that let ranks find each other (NCCL's `ncclUniqueId`).
///
/// It holds the root's store address and a random 256-bit secret that every bootstrap and data
/// connection must prove it knows. Print it with [`UniqueId::to_hex`] and pass it to other ranks
/// (for example in `OXCCL_UNIQUE_ID`); treat it like a password.
///
/// Layout: magic `OXID`, version, address family, port (LE), 16 address bytes, 32 secret bytes,
/// 8 job-id bytes, zero padding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UniqueId({}, secret hidden)",
            self.addr().map(|a| a.to_string()).unwrap_or_else(|_| "invalid".into())
        )
    }
}

/// A store server of an id this process made, not yet owned by a communicator.
pub(super) struct Unowned {
    pub(super) job: [u8; 8],
    /// The fork generation that started it.
    pub(super) generation: u64,
    pub(super) server: Arc<StoreServer>,
}

pub(super) static SERVERS: Mutex<Vec<Unowned>> = Mutex::new(Vec::new());

impl UniqueId {
    /// Create an id: start an authenticated bootstrap store in this process on the interface
    /// chosen by `NCCL_SOCKET_IFNAME` (see [`choose_ip`]). The first communicator this process
    /// builds on the id owns the store and stops it when destroyed; if none does, it lives as long
    /// as the process.
    pub fn new() -> Result<UniqueId> {
        Self::with_config(&Config::from_env())
    }

    /// [`UniqueId::new`], choosing the store's interface from `cfg.socket_ifname`.
    pub fn with_config(cfg: &Config) -> Result<UniqueId> {
        crate::config::init_logging();
        let ip = choose_ip(cfg.socket_ifname.as_deref(), None)?;
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::system(format!("binding the bootstrap store on {ip}"), &e))?;
        let mut secret = [0u8; 32];
        random_bytes(&mut secret)?;
        let mut job = [0u8; 8];
        random_bytes(&mut job)?;
        // with encryption on, the store's traffic is sealed too (docs/security.md)
        let master = cfg.encryption.master(&secret)?;
        let server = StoreServer::start_sealed(listener, Some(secret), master)?;
        let id = UniqueId::encode(server.addr(), &secret, &job);
        tracing::info!("oxccl: bootstrap store listening on {}", server.addr());
        let unowned = Unowned { job, generation: crate::fork_generation(), server: Arc::new(server) };
        SERVERS.lock().unwrap().push(unowned);
        Ok(id)
    }

    fn encode(addr: SocketAddr, secret: &[u8; 32], job: &[u8; 8]) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..4].copy_from_slice(ID_MAGIC);
        b[4] = ID_VERSION;
        b[6..8].copy_from_slice(&addr.port().to_le_bytes());
        match addr.ip() {
            IpAddr::V4(v4) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&v6.octets());
            }
        }
        b[24..56].copy_from_slice(secret);
        b[56..64].copy_from_slice(job);
        UniqueId(b)
    }

    /// Check the magic and version.
    pub fn validate(&self) -> Result<()> {
        if &self.0[0..4] != ID_MAGIC || self.0[4] != ID_VERSION || !matches!(self.0[5], 4 | 6) {
            return Err(Error::invalid_argument("not an oxccl unique id (bad magic, version or address family)"));
        }
        Ok(())
    }

    /// The root store's address.
    pub fn addr(&self) -> Result<SocketAddr> {
        self.validate()?;
        let port = u16::from_le_bytes([self.0[6], self.0[7]]);
        let ip = if self.0[5] == 4 {
            IpAddr::from(<[u8; 4]>::try_from(&self.0[8..12]).unwrap())
        } else {
            IpAddr::from(<[u8; 16]>::try_from(&self.0[8..24]).unwrap())
        };
        Ok(SocketAddr::new(ip, port))
    }

    /// Another job on the same store: the same address and secret, a job id derived from this
    /// one's and `salt`. Each salt is a fresh namespace on the one store (torch's reconfigure:
    /// one handle, a new communicator per instance). The store's server is not handed to the
    /// communicators of derived ids: it stays with the process that made this id.
    pub fn derive(&self, salt: u64) -> Result<UniqueId> {
        let addr = self.addr()?;
        let h = blake3::hash(&[&self.job()[..], &salt.to_le_bytes()].concat());
        let job: [u8; 8] = h.as_bytes()[..8].try_into().unwrap();
        Ok(UniqueId::encode(addr, &self.secret(), &job))
    }

    pub(crate) fn secret(&self) -> [u8; 32] {
        self.0[24..56].try_into().unwrap()
    }

    pub(super) fn job(&self) -> [u8; 8] {
        self.0[56..64].try_into().unwrap()
    }

    /// Tell the ranks of this id's job that are still in init that a rank failed (a launcher
    /// that saw a rank's process die calls this): they fail at once with `why` instead of
    /// waiting until the timeout for a rank that will never join. Ranks past init do not read
    /// it (they notice a dead peer themselves). The first report stands.
    pub fn report_failure(&self, why: &str) -> Result<()> {
        let master = Config::from_env().encryption.master(&self.secret())?;
        let store = TcpStore::connect_sealed(self.addr()?, Some(self.secret()), master, Duration::from_secs(2))?;
        let key = format!("{}/init-failed", job_prefix(&self.job()));
        if !store.check(std::slice::from_ref(&key))? {
            store.set(&key, why.as_bytes())?;
        }
        Ok(())
    }

    /// Lower-case hex (256 characters), for `OXCCL_UNIQUE_ID`.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parse [`UniqueId::to_hex`] output.
    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(Error::invalid_argument(format!(
                "a unique id is {} hex characters, got {}",
                2 * UNIQUE_ID_BYTES,
                s.len()
            )));
        }
        let mut b = [0u8; UNIQUE_ID_BYTES];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| Error::invalid_argument("unique id is not hex"))?;
        }
        let id = UniqueId(b);
        id.validate()?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_roundtrip_and_validation() {
        let id = UniqueId::encode("10.1.2.3:4567".parse().unwrap(), &[7; 32], &[1; 8]);
        assert_eq!(id.addr().unwrap(), "10.1.2.3:4567".parse().unwrap());
        let back = UniqueId::from_hex(&id.to_hex()).unwrap();
        assert_eq!(back, id);
        assert!(!format!("{id:?}").contains("0707"), "debug output hides the secret");
        let v6 = UniqueId::encode("[::1]:9".parse().unwrap(), &[0; 32], &[0; 8]);
        assert_eq!(v6.addr().unwrap(), "[::1]:9".parse().unwrap());
        assert!(UniqueId::from_hex("zz").is_err());
        assert!(UniqueId::from_hex(&"00".repeat(128)).is_err(), "zero id has no magic");
        assert!(UniqueId([0; 128]).addr().is_err());
    }

    #[test]
    fn derived_ids_keep_the_store_and_secret_and_differ_by_salt() {
        let id = UniqueId::encode("10.1.2.3:4567".parse().unwrap(), &[7; 32], &[1; 8]);
        let (a, b) = (id.derive(1).unwrap(), id.derive(2).unwrap());
        for d in [a, b] {
            assert_eq!((d.addr().unwrap(), d.secret()), (id.addr().unwrap(), id.secret()));
            assert_ne!(d.job(), id.job());
        }
        assert_ne!(a.job(), b.job());
        assert_eq!(id.derive(1).unwrap(), a, "deterministic: every rank derives the same");
        assert!(UniqueId([0; 128]).derive(1).is_err());
    }
}
