//! The `healthcheck` subcommand: container images carry no curl, so the binary probes its own
//! `/healthz` over plain TCP and turns the answer into an exit code.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

/// 0 when `GET /healthz` on `addr` answers 200 within two seconds, 1 otherwise.
pub fn healthcheck(addr: SocketAddr) -> i32 {
    match probe(addr) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(err) => {
            eprintln!("healthcheck: {addr}: {err}");
            1
        }
    }
}

fn probe(addr: SocketAddr) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = [0u8; 16];
    let mut filled = 0;
    while filled < head.len() {
        match stream.read(&mut head[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    let status_line = String::from_utf8_lossy(&head[..filled]);
    Ok(status_line.starts_with("HTTP/1.1 200") || status_line.starts_with("HTTP/1.0 200"))
}
