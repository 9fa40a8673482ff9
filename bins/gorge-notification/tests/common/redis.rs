//! A `redis-server` of one test only (broker mode), on a free loopback port with persistence
//! off, so the test can pause (`SIGSTOP`), kill and restart it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use gorge_testkit::{free_port, within_blocking, Process, PATIENCE};

/// A `redis-server` of this test only: loopback, no persistence. Killed on drop.
pub struct Redis {
    pub process: Process,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Redis {
        (0..5)
            .find_map(|_| Redis::start_on(free_port()))
            .expect("redis-server started")
    }

    /// Starts on `port` (once); `None` if it did not answer `PING` in time.
    pub fn start_on(port: u16) -> Option<Redis> {
        let mut command = Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        let process = Process::spawn(command);
        within_blocking(PATIENCE, || ping(port)).then_some(Redis { process, port })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills it and starts an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.process.kill();
        let port = self.port;
        *self = Redis::start_on(port).expect("redis-server restarted on its port");
    }
}

/// Whether a Redis on `port` answers `PING` within a second.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut answer = [0u8; 7];
    stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
}
