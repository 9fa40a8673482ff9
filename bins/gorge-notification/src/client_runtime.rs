//! The client port's own runtime: the threads that accept browsers' connections and run
//! their sockets, at a lower scheduling priority than the rest of the process.
//!
//! Why: anonymous sockets decide how much work these threads have. A flood keeps them busy
//! however bounded each socket's budget is, and on a 2-core box they then compete for the
//! CPU with the admin port's thread (PHP's POSTs) and the fan-out thread (every browser's
//! frames). Linux's nice value is per thread and raising it needs no privilege, so each of
//! these threads adds `CLIENT_WORKER_NICE` (default 10, a weight of 110 against 1 024) to its
//! own when it starts: the scheduler then runs a woken admin or fan-out thread first, and
//! the sockets get whatever CPU is left, which is all of it when nothing else wants it.
//! Going back needs privilege, which is why only these threads are lowered, never the
//! process.
//!
//! It has as many workers as the runtime that starts the server (one per CPU the process
//! may use, so one in a 1-CPU container or under `taskset -c 0`).

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// The name of the client runtime's threads (`/proc/PID/task/*/comm`).
pub const THREAD_NAME: &str = "gorge-client";

/// A runtime shut down without waiting when dropped (it may be dropped inside another
/// runtime, where a blocking shutdown is not allowed).
pub struct ClientRuntime {
    runtime: Option<Runtime>,
}

impl ClientRuntime {
    /// Starts `workers` threads, each `nice` (0..=19) below the thread that starts it.
    pub fn start(workers: usize, nice: i32) -> io::Result<Self> {
        // From the starting thread's value, not the creating thread's: a thread of this
        // runtime that starts another (the blocking pool) is already lowered.
        let target = match rustix::process::getpriority_process(None) {
            Ok(base) if nice > 0 => Some((base + nice).min(19)),
            _ => None,
        };
        let runtime = Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(THREAD_NAME)
            .on_thread_start(move || {
                if let Some(target) = target {
                    set_this_thread(target);
                }
            })
            .enable_all()
            .build()?;
        Ok(ClientRuntime {
            runtime: Some(runtime),
        })
    }

    /// Where the client listeners are spawned.
    pub fn handle(&self) -> Handle {
        self.runtime
            .as_ref()
            .expect("present until dropped")
            .handle()
            .clone()
    }
}

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sets the calling thread's nice value. A failure leaves the thread as it was: the sockets
/// are served all the same, only not behind the admin port.
fn set_this_thread(nice: i32) {
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice);
}
