//! The admin port's own runtime: one thread that accepts and answers PHP's POSTs, probes
//! and `/status/`, out of reach of the browsers' sockets.
//!
//! Browser sockets run on the client runtime (`client_runtime`, at a lower priority);
//! however many of them flood it with frames (each read is bounded and yields, but a worker
//! is still busy while they keep coming), the kernel schedules this thread on its own, and
//! the admin listener is registered with this runtime's reactor (gorge-service moves it when
//! it starts serving), so PHP's POST is accepted and answered as soon as it arrives. The handlers share no lock with the sessions beyond the hub's, which is
//! held only briefly and never across I/O.

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// A one-thread runtime, shut down without waiting when dropped (it may be dropped inside
/// another runtime, where a blocking shutdown is not allowed).
pub struct AdminRuntime {
    runtime: Option<Runtime>,
}

impl AdminRuntime {
    /// Starts the runtime's thread.
    pub fn start() -> io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gorge-admin")
            .enable_all()
            .build()?;
        Ok(AdminRuntime {
            runtime: Some(runtime),
        })
    }

    /// Where the admin listener is spawned.
    pub fn handle(&self) -> Handle {
        self.runtime
            .as_ref()
            .expect("present until dropped")
            .handle()
            .clone()
    }
}

impl Drop for AdminRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
