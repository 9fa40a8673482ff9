//! The shutdown signal and the service run loop: serve every bound listener until SIGTERM,
//! SIGINT or a programmatic trigger, then stop in a fixed order — readiness off, close the
//! listeners that asked to close early, the service's own drain, close the others and end
//! open connections, let in-flight requests finish — each step bounded. Closing before the
//! drain lets a new process started on the same ports (they bind with `SO_REUSEPORT`) take
//! every new connection while this one drains.
//! If any listener dies while serving, everything stops: a process that accepts on one port
//! but not the other is worse than one that is visibly down.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use slog::Logger;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::probes::Probes;
use crate::server::{serve, BoundListener, Stops};
use crate::{emit, events};

/// A cloneable shutdown switch. [`run`] flips it on SIGTERM/SIGINT; anything may flip it.
#[derive(Clone)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A switch that is off.
    pub fn new() -> Self {
        Shutdown {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Turns the switch on (idempotent); every [`Shutdown::triggered`] completes.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Whether the switch is on.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once the switch is on (immediately if it already is).
    pub async fn triggered(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|on| *on).await;
    }
}

/// The service's own drain, run after readiness is off and before listeners stop.
pub type DrainHook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A drain hook for services with nothing of their own to drain.
pub fn no_drain() -> DrainHook {
    Box::new(|| Box::pin(async {}))
}

/// How [`run`] drains.
pub struct RunOptions {
    /// Upper bound for the service's drain hook.
    pub drain_deadline: Duration,
    /// Upper bound for in-flight HTTP requests to finish once listeners have stopped.
    pub request_grace: Duration,
    /// The switch [`run`] waits on (and flips on SIGTERM/SIGINT).
    pub shutdown: Shutdown,
}

/// Why [`run`] ended other than with a clean drain.
#[derive(Debug)]
pub enum RunError {
    /// A listener failed (an accept error that is not transient) or stopped outside a
    /// shutdown; the process must not limp on without it.
    ListenerFailed {
        /// The listener's name.
        name: String,
        /// Its bound address.
        addr: SocketAddr,
        /// The accept error.
        source: io::Error,
    },
    /// SIGTERM/SIGINT handlers could not be installed.
    Signals(io::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::ListenerFailed { name, addr, source } => {
                write!(f, "{name} listener on {addr} failed: {source}")
            }
            RunError::Signals(err) => write!(f, "cannot install signal handlers: {err}"),
        }
    }
}

impl std::error::Error for RunError {}

/// Serves `listeners` until shutdown, then drains. Returns `Ok` after a clean drain and an
/// error when a listener failed (the caller exits non-zero).
pub async fn run(
    listeners: Vec<BoundListener>,
    probes: Arc<Probes>,
    drain: DrainHook,
    opts: RunOptions,
    log: &Logger,
) -> Result<(), RunError> {
    let mut signals = Signals::install().map_err(RunError::Signals)?;
    let (accept_tx, accept_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (connections_tx, connections_rx) = watch::channel(());
    let mut serving = JoinSet::new();
    let mut closing_early = 0;
    for listener in listeners {
        let (name, addr) = (listener.name().to_string(), listener.local_addr());
        emit!(log, events::LISTENING; "listener" => &name, "addr" => %addr);
        let early = listener.closes_at_drain_start();
        closing_early += usize::from(early);
        // A listener that closes early lets its idle kept-alive connections go then too
        // (requests in flight finish): a client's next request opens a new connection,
        // which reaches the process that listens on the port now.
        let stops = Stops {
            accept: if early { &accept_rx } else { &stop_rx }.clone(),
            connections: if early { &accept_rx } else { &stop_rx }.clone(),
        };
        let open = connections_rx.clone();
        let log = log.clone();
        let runtime = listener.runtime();
        let serving_it = async move { (name, addr, serve(listener, stops, open, log).await) };
        match runtime {
            Some(runtime) => serving.spawn_on(serving_it, &runtime),
            None => serving.spawn(serving_it),
        };
    }
    drop(connections_rx);

    let failure = tokio::select! {
        signal = signals.next() => {
            emit!(log, events::SHUTDOWN_STARTED; "reason" => signal);
            opts.shutdown.trigger();
            None
        }
        _ = opts.shutdown.triggered() => {
            emit!(log, events::SHUTDOWN_STARTED; "reason" => "requested");
            None
        }
        Some(joined) = serving.join_next() => {
            let failure = match joined {
                Ok((name, addr, Err(source))) => RunError::ListenerFailed { name, addr, source },
                Ok((name, addr, Ok(()))) => RunError::ListenerFailed {
                    name, addr, source: io::Error::other("listener stopped unexpectedly"),
                },
                Err(join) => RunError::ListenerFailed {
                    name: "unknown".into(),
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    source: io::Error::other(join.to_string()),
                },
            };
            emit!(log, events::LISTENER_FAILED; "error" => %failure);
            opts.shutdown.trigger();
            Some(failure)
        }
    };

    probes.set_draining();
    accept_tx.send_replace(true);
    // Those listeners return promptly. After a listener failure nothing is counted on (the
    // failed one may have been among them); all are reaped after the drain either way.
    if closing_early > 0 && failure.is_none() {
        for _ in 0..closing_early {
            if serving.join_next().await.is_none() {
                break;
            }
        }
        emit!(log, events::LISTENERS_CLOSED; "listeners" => closing_early);
    }
    if tokio::time::timeout(opts.drain_deadline, drain())
        .await
        .is_err()
    {
        emit!(log, events::DRAIN_DEADLINE_EXCEEDED; "deadline_ms" => opts.drain_deadline.as_millis() as u64);
    }
    stop_tx.send_replace(true);
    while serving.join_next().await.is_some() {}
    if tokio::time::timeout(opts.request_grace, connections_tx.closed())
        .await
        .is_err()
    {
        emit!(log, events::REQUESTS_ABANDONED; "open_connections" => connections_tx.receiver_count());
    }
    match failure {
        Some(failure) => Err(failure),
        None => {
            emit!(log, events::SHUTDOWN_COMPLETE);
            Ok(())
        }
    }
}

struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}
