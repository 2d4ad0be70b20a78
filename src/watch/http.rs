//! The metrics endpoint: a minimal HTTP/1.1 server answering `GET /metrics`, one request per
//! connection, in one thread that sleeps in `accept` between scrapes.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Bind `addr:port` (0: any free port; taken: the next free one, up to +63) and serve there.
pub(super) fn serve(addr: IpAddr, port: u16) -> std::io::Result<SocketAddr> {
    let mut last = None;
    let tries = if port == 0 { 1 } else { 64 };
    for p in (0..tries).map(|k| port.saturating_add(k)) {
        match TcpListener::bind(SocketAddr::new(addr, p)) {
            Ok(l) => {
                let at = l.local_addr()?;
                std::thread::Builder::new().name("oxccl-metrics".into()).spawn(move || {
                    for s in l.incoming().map_while(Result::ok) {
                        let _ = answer(s);
                    }
                })?;
                return Ok(at);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port")))
}

/// Read one request (its head, at most 8 KiB, within 2 s) and answer it.
fn answer(mut s: TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (status, body) = match (words.next(), words.next()) {
        (Some("GET"), Some("/metrics")) => ("200 OK", super::registry::render_all()),
        (Some("GET"), Some(_)) => ("404 Not Found", "only /metrics is served here\n".to_string()),
        _ => ("400 Bad Request", "GET /metrics\n".to_string()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(reply.as_bytes())
}
