//! The two runtimes the ports run on beside the main one: the admin port's, out of the
//! browsers' reach, and the client port's, at a lower scheduling priority.
//!
//! The admin port has one thread that accepts and answers PHP's POSTs, probes and
//! `/status/`. However many browsers' sockets flood the client runtime with frames (each
//! read is bounded and yields, but a worker is still busy while they keep coming), the
//! kernel schedules this thread on its own, and the admin listener is registered with this
//! runtime's reactor (gorge-service moves it when it starts serving), so PHP's POST is
//! accepted and answered as soon as it arrives. The handlers share no lock with the sessions
//! beyond the hub's, which is held only briefly and never across I/O.
//!
//! The client port's threads accept browsers' connections and run their sockets. Anonymous
//! sockets decide how much work these threads have: a flood keeps them busy however bounded
//! each socket's budget is, and on a 2-core box they then compete for the CPU with the admin
//! port's thread and the fan-out thread (every browser's frames). Linux's nice value is per
//! thread and raising it needs no privilege, so each of these threads adds
//! `CLIENT_WORKER_NICE` (default 10, a weight of 110 against 1 024) to its own when it
//! starts: the scheduler then runs a woken admin or fan-out thread first, and the sockets get
//! whatever CPU is left, which is all of it when nothing else wants it. Going back needs
//! privilege, which is why only these threads are lowered, never the process. It has as many
//! workers as the runtime that starts the server (one per CPU the process may use, so one in
//! a 1-CPU container or under `taskset -c 0`).

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// The name of the admin runtime's thread (`/proc/PID/task/*/comm`).
pub const ADMIN_THREAD_NAME: &str = "gorge-admin";

/// The name of the client runtime's threads.
pub const CLIENT_THREAD_NAME: &str = "gorge-client";

/// A runtime of the server's own, shut down without waiting when dropped (it may be dropped
/// inside another runtime, where a blocking shutdown is not allowed).
pub struct OwnRuntime {
    runtime: Option<Runtime>,
}

impl OwnRuntime {
    /// The admin port's runtime: one thread at the process's priority.
    pub fn admin() -> io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(ADMIN_THREAD_NAME)
            .enable_all()
            .build()?;
        Ok(OwnRuntime {
            runtime: Some(runtime),
        })
    }

    /// The client port's runtime: `workers` threads, each `nice` (0..=19) below the thread
    /// that starts it.
    pub fn client(workers: usize, nice: i32) -> io::Result<Self> {
        // From the starting thread's value, not the creating thread's: a thread of this
        // runtime that starts another (the blocking pool) is already lowered.
        let target = match rustix::process::getpriority_process(None) {
            Ok(base) if nice > 0 => Some((base + nice).min(19)),
            _ => None,
        };
        let runtime = Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(CLIENT_THREAD_NAME)
            .on_thread_start(move || {
                if let Some(target) = target {
                    set_this_thread(target);
                }
            })
            .enable_all()
            .build()?;
        Ok(OwnRuntime {
            runtime: Some(runtime),
        })
    }

    /// Where the port's listeners are spawned.
    pub fn handle(&self) -> Handle {
        self.runtime
            .as_ref()
            .expect("present until dropped")
            .handle()
            .clone()
    }
}

impl Drop for OwnRuntime {
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
