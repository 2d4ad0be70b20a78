//! The flight record's format: one type, written by the communicator on its first error
//! (`OXCCL_DUMP_DIR`) and read by `oxccl-perf --analyze`, so the two cannot drift. JSON, with a
//! parser for exactly what [`FlightRecord::to_json`] writes (and any equivalent JSON).

/// How a recorded operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpState {
    /// Still running when the record was written.
    Running,
    /// Ended with an error.
    Failed,
    /// Completed.
    Done,
}

impl OpState {
    /// The name the record uses.
    pub fn name(self) -> &'static str {
        match self {
            OpState::Running => "running",
            OpState::Failed => "failed",
            OpState::Done => "done",
        }
    }
}

/// One operation of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightOp {
    /// Sequence number (collective counter, or per-peer counter for send/recv).
    pub seq: u64,
    /// The call, as its fingerprint prints (`allreduce(type=float, count=4, ...)`).
    pub op: String,
    /// The caller's profiler tag (0: untagged).
    pub tag: u64,
    /// How it ended.
    pub state: OpState,
    /// Peers it receives from.
    pub recv_from: Vec<u64>,
    /// Peers it sends to.
    pub send_to: Vec<u64>,
    /// Start, µs after the communicator was created.
    pub start_us: u64,
    /// End, likewise (`None`: still running).
    pub end_us: Option<u64>,
}

/// The record one rank writes: who it is, the error, its last operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightRecord {
    /// Communicator id (16 hex digits).
    pub comm: String,
    /// This rank.
    pub rank: u64,
    /// Ranks in the communicator.
    pub nranks: u64,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u64,
    /// When the communicator was created (Unix ms).
    pub created_unix_ms: u64,
    /// The first error.
    pub error: String,
    /// The straggler this rank saw, if any ([`crate::Communicator::straggler`]; empty: none).
    pub straggler: String,
    /// The last operations, oldest first.
    pub ops: Vec<FlightOp>,
}

fn quote(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

impl FlightRecord {
    /// The record as JSON (one operation per line).
    pub fn to_json(&self) -> String {
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|o| {
                format!(
                    "{{\"seq\": {}, \"op\": {}, \"tag\": {}, \"state\": \"{}\", \"recv_from\": {:?}, \"send_to\": {:?}, \"start_us\": {}, \"end_us\": {}}}",
                    o.seq,
                    quote(&o.op),
                    o.tag,
                    o.state.name(),
                    o.recv_from,
                    o.send_to,
                    o.start_us,
                    o.end_us.map_or("null".to_string(), |t| t.to_string())
                )
            })
            .collect();
        format!(
            "{{\"comm\": {}, \"rank\": {}, \"nranks\": {}, \"host\": {}, \"pid\": {}, \"created_unix_ms\": {}, \"error\": {}, \"straggler\": {}, \"ops\": [\n  {}\n]}}\n",
            quote(&self.comm),
            self.rank,
            self.nranks,
            quote(&self.host),
            self.pid,
            self.created_unix_ms,
            quote(&self.error),
            quote(&self.straggler),
            ops.join(",\n  ")
        )
    }

    /// Read a record; the error names what is missing or malformed.
    pub fn parse(text: &str) -> Result<FlightRecord, String> {
        let mut p = json::Parser { s: text.as_bytes(), at: 0 };
        let v = p.value()?;
        p.end()?;
        let ops = v.get("ops")?.array()?.iter().map(op_of).collect::<Result<Vec<_>, String>>()?;
        Ok(FlightRecord {
            comm: v.get("comm")?.string()?,
            rank: v.get("rank")?.uint()?,
            nranks: v.get("nranks")?.uint()?,
            host: v.get("host")?.string()?,
            pid: v.get("pid")?.uint()?,
            created_unix_ms: v.get("created_unix_ms")?.uint()?,
            error: v.get("error")?.string()?,
            // (records written before it existed have none)
            straggler: v.get("straggler").and_then(json::Value::string).unwrap_or_default(),
            ops,
        })
    }
}

fn op_of(o: &json::Value) -> Result<FlightOp, String> {
    let state = match o.get("state")?.string()?.as_str() {
        "running" => OpState::Running,
        "failed" => OpState::Failed,
        "done" => OpState::Done,
        other => return Err(format!("unknown operation state {other:?}")),
    };
    let peers = |k: &str| -> Result<Vec<u64>, String> { o.get(k)?.array()?.iter().map(json::Value::uint).collect() };
    let end = o.get("end_us")?;
    Ok(FlightOp {
        seq: o.get("seq")?.uint()?,
        op: o.get("op")?.string()?,
        tag: o.get("tag")?.uint()?,
        state,
        recv_from: peers("recv_from")?,
        send_to: peers("send_to")?,
        start_us: o.get("start_us")?.uint()?,
        end_us: if matches!(end, json::Value::Null) { None } else { Some(end.uint()?) },
    })
}

/// The JSON subset a flight record uses: objects, arrays, strings, non-negative integers, null.
mod json {
    pub(super) enum Value {
        Null,
        Num(u64),
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        pub(super) fn get(&self, k: &str) -> Result<&Value, String> {
            match self {
                Value::Obj(m) => m.iter().find(|(x, _)| x == k).map(|(_, v)| v).ok_or(format!("no field {k:?}")),
                _ => Err(format!("field {k:?} of a value that is not an object")),
            }
        }
        pub(super) fn uint(&self) -> Result<u64, String> {
            match self {
                Value::Num(n) => Ok(*n),
                _ => Err("a number was expected".into()),
            }
        }
        pub(super) fn string(&self) -> Result<String, String> {
            match self {
                Value::Str(s) => Ok(s.clone()),
                _ => Err("a string was expected".into()),
            }
        }
        pub(super) fn array(&self) -> Result<&[Value], String> {
            match self {
                Value::Arr(a) => Ok(a),
                _ => Err("an array was expected".into()),
            }
        }
    }

    pub(super) struct Parser<'a> {
        pub(super) s: &'a [u8],
        pub(super) at: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.s.get(self.at).is_some_and(|c| c.is_ascii_whitespace()) {
                self.at += 1;
            }
        }
        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.s.get(self.at) == Some(&c) {
                self.at += 1;
                Ok(())
            } else {
                Err(format!("expected {:?} at byte {}", c as char, self.at))
            }
        }
        pub(super) fn end(&mut self) -> Result<(), String> {
            self.ws();
            if self.at == self.s.len() {
                Ok(())
            } else {
                Err(format!("trailing bytes at {}", self.at))
            }
        }
        pub(super) fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.s.get(self.at).copied() {
                Some(b'{') => self.object(),
                Some(b'[') => self.list(),
                Some(b'"') => self.string().map(Value::Str),
                Some(b'n') if self.s[self.at..].starts_with(b"null") => {
                    self.at += 4;
                    Ok(Value::Null)
                }
                Some(c) if c.is_ascii_digit() => {
                    let start = self.at;
                    while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
                        self.at += 1;
                    }
                    let t = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
                    t.parse().map(Value::Num).map_err(|_| format!("number {t:?} out of range"))
                }
                _ => Err(format!("unexpected input at byte {}", self.at)),
            }
        }
        fn object(&mut self) -> Result<Value, String> {
            self.eat(b'{')?;
            let mut m = Vec::new();
            self.ws();
            if self.s.get(self.at) == Some(&b'}') {
                self.at += 1;
                return Ok(Value::Obj(m));
            }
            loop {
                self.ws();
                let k = self.string()?;
                self.eat(b':')?;
                m.push((k, self.value()?));
                self.ws();
                match self.s.get(self.at) {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        return Ok(Value::Obj(m));
                    }
                    _ => return Err(format!("expected ',' or '}}' at byte {}", self.at)),
                }
            }
        }
        fn list(&mut self) -> Result<Value, String> {
            self.eat(b'[')?;
            let mut a = Vec::new();
            self.ws();
            if self.s.get(self.at) == Some(&b']') {
                self.at += 1;
                return Ok(Value::Arr(a));
            }
            loop {
                a.push(self.value()?);
                self.ws();
                match self.s.get(self.at) {
                    Some(b',') => self.at += 1,
                    Some(b']') => {
                        self.at += 1;
                        return Ok(Value::Arr(a));
                    }
                    _ => return Err(format!("expected ',' or ']' at byte {}", self.at)),
                }
            }
        }
        fn string(&mut self) -> Result<String, String> {
            self.eat(b'"')?;
            let mut out = Vec::new();
            loop {
                let c = *self.s.get(self.at).ok_or("unterminated string")?;
                self.at += 1;
                match c {
                    b'"' => return String::from_utf8(out).map_err(|_| "a string is not UTF-8".into()),
                    b'\\' => {
                        let e = *self.s.get(self.at).ok_or("unterminated escape")?;
                        self.at += 1;
                        match e {
                            b'"' | b'\\' | b'/' => out.push(e),
                            b'n' => out.push(b'\n'),
                            b't' => out.push(b'\t'),
                            b'r' => out.push(b'\r'),
                            b'u' => {
                                let hex = self.s.get(self.at..self.at + 4).ok_or("short \\u escape")?;
                                let h = std::str::from_utf8(hex).ok().and_then(|h| u32::from_str_radix(h, 16).ok());
                                let ch = h.and_then(char::from_u32).ok_or("bad \\u escape")?;
                                self.at += 4;
                                out.extend_from_slice(ch.to_string().as_bytes());
                            }
                            _ => return Err(format!("bad escape at byte {}", self.at)),
                        }
                    }
                    c => out.push(c),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FlightRecord {
        FlightRecord {
            comm: "00000000deadbeef".into(),
            rank: 1,
            nranks: 4,
            host: "h\"1\\".into(),
            pid: 77,
            created_unix_ms: 1_764_000_000_000,
            error: "rank 1: timed out\nwaiting for rank 2\t\u{1}".into(),
            straggler: "rank 3 was last to arrive in 91% of the last 1000 operations, median lag 14.0 ms".into(),
            ops: vec![
                FlightOp {
                    seq: 3,
                    op: "allreduce(type=float, count=4)".into(),
                    tag: 9,
                    state: OpState::Done,
                    recv_from: vec![0],
                    send_to: vec![2],
                    start_us: 10,
                    end_us: Some(20),
                },
                FlightOp {
                    seq: 4,
                    op: "send/recv(type=int8, count=1)".into(),
                    tag: 0,
                    state: OpState::Running,
                    recv_from: vec![],
                    send_to: vec![0, 3],
                    start_us: 30,
                    end_us: None,
                },
            ],
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_is_json() {
        let r = sample();
        let text = r.to_json();
        assert_eq!(FlightRecord::parse(&text).unwrap(), r);
        // any JSON reader agrees with the format
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ops"][1]["send_to"][1], 3);
        assert_eq!(v["error"].as_str().unwrap(), r.error);
    }

    #[test]
    fn malformed_records_are_refused_with_a_reason() {
        let text = sample().to_json();
        for cut in [0, 1, text.len() / 2, text.len() - 3] {
            assert!(FlightRecord::parse(&text[..cut]).is_err(), "cut at {cut}");
        }
        let e = FlightRecord::parse(&text.replace("\"pid\"", "\"pud\"")).unwrap_err();
        assert!(e.contains("pid"), "{e}");
        assert!(FlightRecord::parse(&text.replace("\"done\"", "\"finished\"")).is_err());
        assert!(FlightRecord::parse(&(text.clone() + "x")).is_err());
    }
}
