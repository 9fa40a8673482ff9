//! Graceful drain on SIGTERM (docs/notification.md, "Failure behaviour"): close every socket with 1001, spread over the drain
//! window with jitter, while the peer relay flushes its queues (or the broker its publish
//! queue).
//!
//! Browsers reconnect immediately after a close and then back off without jitter; closing
//! thousands of sockets in the same second would move them all onto the remaining pods at
//! once. Each socket gets its own slot of the window plus a random offset inside the slot.

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;
use tokio::time::Instant;

use gorge_hub::CloseReason;

use crate::events;
use crate::state::ServerState;
use gorge_service::emit;

/// How long after the window sockets may still write their backlog and close.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How much longer than the sockets the drain waits for them (whole drain: window + 2.5 s,
/// within the hook's bound of window + 3 s).
const SESSION_END_MARGIN: Duration = Duration::from_millis(500);

/// When each of `count` sockets is closed, as offsets into `window`: one slot per socket,
/// a uniformly random point inside each slot, in increasing order.
pub fn close_offsets(count: usize, window: Duration, rng: &mut impl Rng) -> Vec<Duration> {
    if count == 0 {
        return Vec::new();
    }
    let slot = window.as_secs_f64() / count as f64;
    (0..count)
        .map(|i| Duration::from_secs_f64(slot * (i as f64 + rng.random::<f64>())))
        .collect()
}

/// Runs the drain; returns when every socket is closed or the window (plus a short grace for
/// the last close handshakes) has passed. The caller bounds the whole drain again.
pub async fn drain(state: Arc<ServerState>, window: Duration) {
    let started = Instant::now();
    // Sockets still closing get a moment for their close handshake, and every socket
    // until then to write its backlog before the 1001.
    let grace = started + window + CLOSE_GRACE;
    let _ = state.drain_ends.set(grace);
    state.metrics.draining.set(1);
    let mut sockets = state.hub.send_queues();
    emit!(state.log, events::NOTIFY_DRAIN_STARTED;
        "sockets" => sockets.len(), "window_ms" => window.as_millis() as u64);
    let offsets = {
        let mut rng = rand::rng();
        sockets.shuffle(&mut rng);
        close_offsets(sockets.len(), window, &mut rng)
    };
    // What PHP posted here last still goes to the peers or the stream (relaying and
    // publishing go on until exit).
    let flushing = state.clone();
    let flushed = tokio::spawn(async move { flushing.cluster.flush(window).await });
    for (send_queue, offset) in sockets.iter().zip(offsets) {
        tokio::time::sleep_until(started + offset).await;
        send_queue.close(CloseReason::GoingAway);
    }
    // Sockets whose upgrade was already under way when the drain began were not in the
    // snapshot above; they go at the end of the window.
    for send_queue in state.hub.send_queues() {
        send_queue.close(CloseReason::GoingAway);
    }
    loop {
        let ended = state.session_ended.notified();
        if state.hub.open_sockets() == 0 {
            break;
        }
        // A little past the sockets' own deadline, so sockets ending at it are counted.
        if tokio::time::timeout_at(grace + SESSION_END_MARGIN, ended)
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = flushed.await;
    emit!(state.log, events::NOTIFY_DRAIN_DONE;
        "open_sockets" => state.hub.open_sockets(),
        "elapsed_ms" => started.elapsed().as_millis() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cover_the_window_in_order() {
        let mut rng = rand::rng();
        let window = Duration::from_secs(10);
        let offsets = close_offsets(200, window, &mut rng);
        assert_eq!(offsets.len(), 200);
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        assert!(offsets.iter().all(|o| *o < window));
        // One per 50 ms slot: the first is in the first slot, the last in the last.
        assert!(offsets[0] < Duration::from_millis(50));
        assert!(offsets[199] >= Duration::from_millis(9950));
    }

    #[test]
    fn no_sockets_no_offsets() {
        assert!(close_offsets(0, Duration::from_secs(1), &mut rand::rng()).is_empty());
    }
}
