//! Control messages (HELLO, NOTIFY, CREDIT, FLUSH, FLUSHED, CLOSED): what each does to the
//! engine's state.

use super::*;

impl Net {
    /// Apply one control message. Malformed or unknown ones are dropped (a stranger's bytes
    /// change nothing: HELLO needs a proof, the others a connection id that was accepted).
    pub(crate) fn dispatch(&self, st: &mut NetState, m: &[u8]) {
        if m.len() < 16 {
            return;
        }
        let id = u32::from_le_bytes(m[4..8].try_into().unwrap());
        let v = u64::from_le_bytes(m[8..16].try_into().unwrap());
        match m[0] {
            T_HELLO => {
                let Some(r) = st.recvs.get_mut(&id) else { return };
                if r.hello.is_some() || m.len() < HELLO_ADDRS + 2 {
                    return;
                }
                let sender_id = u32::from_le_bytes(m[8..12].try_into().unwrap());
                let token: [u8; 16] = m[12..28].try_into().unwrap();
                let word: [u8; oxccl_transport::seal::WORD_BYTES] = m[HELLO_WORD..HELLO_ADDRS].try_into().unwrap();
                let ctx = hello_context(self.ctx.comm_id, &token, &word);
                if token != r.token || !verify_proof(&self.ctx.secret, &ctx, &m[28..HELLO_WORD]) {
                    tracing::warn!("dropped an RDMA hello with a bad proof for connection {id}");
                    return;
                }
                if word != r.word {
                    r.error = Some(oxccl_transport::seal::mode_mismatch(r.peer, "RDMA", &r.word, &word));
                    return;
                }
                let Some((addrs, _)) = decode_addrs(&m[HELLO_ADDRS..]) else { return };
                match addrs.iter().map(|a| self.fab.insert_peer(a)).collect::<Result<Vec<u64>>>() {
                    Ok(dests) => r.hello = Some((dests, sender_id)),
                    Err(e) => tracing::warn!("dropped an RDMA hello: {e}"),
                }
            }
            T_NOTIFY => {
                // not filtered on HELLO: with striping, a NOTIFY travels on another endpoint pair
                // than the HELLO and may overtake it (the slot's header is checked when read)
                if let Some(r) = st.recvs.get_mut(&id).and_then(|r| admit(r.ctl.as_mut(), m).then_some(r)) {
                    let slots = r.notified.len() as u64;
                    r.notified[(v % slots) as usize] = v + 1;
                }
            }
            T_CREDIT => {
                if let Some(s) = st.sends.get_mut(&id).and_then(|s| admit(s.ctl.as_mut(), m).then_some(s)) {
                    s.credits = s.credits.max(v);
                }
            }
            T_FLUSH => {
                // answered for an accepted connection only (open or closed), to the sender's
                // own endpoint from its HELLO: a stranger's FLUSH gets nothing
                let to = match st.recvs.get_mut(&id) {
                    Some(r) => r.hello.clone().map(|h| (h, r.ctl.as_mut())),
                    None => st.closed_recvs.get_mut(&id).map(|c| ((c.0.clone(), c.1), c.2.as_mut())),
                };
                let Some(((dests, sender_id), mut keys)) = to else { return };
                if !admit(keys.as_deref_mut(), m) {
                    return;
                }
                {
                    let m = seal_ctl(keys, control(T_FLUSHED, sender_id, v, true));
                    if let Err(e) = self.send_msg(st, 0, dests[0], &m, Owner::Reply) {
                        tracing::info!("could not answer a FLUSH: {e}");
                    }
                }
            }
            T_FLUSHED => {
                let Some(&(_, sid)) = st.flushes.get(&v) else { return };
                let keys = match st.sends.get_mut(&sid) {
                    Some(s) => s.ctl.as_mut(),
                    None => st.closing_ctl.get_mut(&sid),
                };
                if admit(keys, m) {
                    st.flushes.remove(&v);
                    if !st.flushes.values().any(|f| f.1 == sid) {
                        st.closing_ctl.remove(&sid);
                    }
                }
            }
            T_CLOSED if m.len() > 16 && m[16] == 0 => {
                // the sender closed after `v` messages: once they are read, nothing more comes
                if let Some(r) =
                    st.recvs.get_mut(&id).and_then(|r| (r.hello.is_some() && admit(r.ctl.as_mut(), m)).then_some(r))
                {
                    r.closed_after = Some(v);
                }
            }
            T_CLOSED => {
                // the receiver closed: it will read nothing more, nor answer
                let keys = match st.sends.get_mut(&id) {
                    Some(s) => s.ctl.as_mut(),
                    None => st.closing_ctl.get_mut(&id),
                };
                if !admit(keys, m) {
                    return;
                }
                st.flushes.retain(|_, f| f.1 != id);
                if let Some(s) = st.sends.get_mut(&id) {
                    s.receiver_closed = true;
                }
            }
            T_ABORT if m.len() > 16 => {
                if m[16] == 0 {
                    if let Some(r) =
                        st.recvs.get_mut(&id).and_then(|r| (r.hello.is_some() && admit(r.ctl.as_mut(), m)).then_some(r))
                    {
                        r.aborted = true;
                    }
                } else if let Some(s) = st.sends.get_mut(&id).and_then(|s| admit(s.ctl.as_mut(), m).then_some(s)) {
                    s.aborted = true;
                }
            }
            _ => {}
        }
    }
}
