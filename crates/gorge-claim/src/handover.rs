//! Which rows Phorge has handed over, and a bounded way to find them.
//!
//! A stock Phorge runs a `HeraldWebhookWorker` task for every request, so a row is
//! gorge-webhook's to deliver only once Phorge says so. The hand-over kit
//! (`compat/phorge/`) says so inside Phorge's own columns: it adds the key
//! `"handedOverTo":"gorge-webhook"` to the row's `properties` JSON when it hands the row
//! over instead of running a PHP task for it (`HeraldWebhookRequest::queueCall()` for new
//! requests, `HeraldWebhookWorker::doWork()` for tasks queued before the switch). Every
//! statement that selects or writes a row for delivery requires that key, so an unpatched
//! or un-switched Phorge hands over nothing and nothing is sent twice: a row is either
//! Phorge's (no key) or ours (the key), and only the kit's rollback helper, under the hook
//! lock and only for a row not in flight, takes one back. Result writes rewrite
//! `properties` whole, keeping every key, so the marker survives retries.
//!
//! Filtering on a key inside a JSON text column needs the row itself, not just the
//! `key_status (status, id)` index, and the queued rows may be Phorge's (a stock Phorge's
//! backlog, tasks queued before the switch). So the candidate query never looks at more
//! than two windows of [`CandidateWindow::size`] queued ids: the oldest ones (oldest
//! first, as Phorge's queue), and a second window at a cursor that sweeps the rest of the
//! queue one window per poll, so rows behind a long head that is not ours, or not ready,
//! are still found. The window bounds come from the index alone ([`WINDOW_BOUNDS_SQL`]),
//! reading `2 × size` index entries; while batches come back full (a backlog draining) the
//! bounds of the last poll are used again within the same second, so a drain does not pay
//! for them on every poll. Stale bounds only shift the windows: rows only leave the queue
//! below them and new rows get higher ids, so they hold at most `size` queued ids each, plus,
//! when the sweep window reaches the end of the queue, the rows inserted within that second.

use std::sync::Mutex;

/// The `properties` key the kit writes into a row it hands over.
pub const HANDOVER_KEY: &str = "handedOverTo";

/// Its value.
pub const HANDOVER_VALUE: &str = "gorge-webhook";

/// The SQL condition "this row was handed over": the marker's bytes as both PHP's
/// `json_encode` and this service's rewrite write them (compact, no escapes needed).
/// `properties` is `utf8mb4_bin`, so the match is exact. Inside a JSON string the quotes
/// would be escaped (`\"`), so a value can never fake the key.
macro_rules! handed_over_sql {
    () => {
        r#"properties LIKE '%"handedOverTo":"gorge-webhook"%'"#
    };
}
pub(crate) use handed_over_sql;

/// `properties` of `text` with the marker added as the first key, for tests and tools that
/// insert rows the way a switched Phorge hands them over (Phorge itself appends the key;
/// the service matches it anywhere). Text that is not a JSON object is returned unchanged.
pub fn with_marker(text: &str) -> String {
    let marker = format!(r#""{HANDOVER_KEY}":"{HANDOVER_VALUE}""#);
    match text.trim_start().strip_prefix('{') {
        Some(rest) if rest.trim_start().starts_with('}') => format!("{{{marker}{rest}"),
        Some(rest) => format!("{{{marker},{rest}"),
        None => text.to_owned(),
    }
}

/// Queued ids at most one candidate query looks at in each of its two windows (at least
/// the batch limit).
pub const MIN_WINDOW: u64 = 1000;

/// The ends of both windows, from the `key_status (status, id)` index only: the id of the
/// `size`-th oldest queued row, and of the `size`-th queued row after the cursor. NULL when
/// there are fewer rows.
pub(crate) const WINDOW_BOUNDS_SQL: &str = "\
SELECT \
 (SELECT id FROM herald_webhookrequest WHERE status = 'queued' ORDER BY id ASC LIMIT 1 OFFSET ?), \
 (SELECT id FROM herald_webhookrequest WHERE status = 'queued' AND id > ? ORDER BY id ASC LIMIT 1 OFFSET ?)";

/// The newest rows, marked or not, for [`crate::ClaimStore::handover_sample`].
pub(crate) const NEWEST_ROWS_SQL: &str = concat!(
    "SELECT dateCreated, ",
    handed_over_sql!(),
    " FROM herald_webhookrequest ORDER BY id DESC LIMIT ?"
);

/// How many of the newest rows [`crate::ClaimStore::handover_sample`] reads.
pub const SAMPLE_ROWS: u64 = 32;

/// What the newest rows say about the hand-over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandoverSample {
    /// `dateCreated` of the newest row; `None` when the table is empty.
    pub newest_created: Option<u64>,
    /// Whether any of the [`SAMPLE_ROWS`] newest rows carries the marker.
    pub any_marked: bool,
}

/// The id ranges one candidate query covers: `id <= head_end OR (sweep_start < id <=
/// sweep_end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowRanges {
    pub head_end: u64,
    pub sweep_start: u64,
    pub sweep_end: u64,
}

/// The sweep cursor of one process (its replicas sweep on their own), and the last ranges
/// while they may be used again. The lock is held only to read or replace them, never
/// across a query.
#[derive(Debug, Default)]
pub(crate) struct CandidateWindow {
    state: Mutex<WindowState>,
}

#[derive(Debug, Default)]
struct WindowState {
    cursor: u64,
    /// The ranges of a poll whose batch was full, and that poll's `now`.
    reusable: Option<(WindowRanges, u64)>,
}

impl CandidateWindow {
    /// Window size for a batch of `limit` rows.
    pub fn size(limit: usize) -> u64 {
        (limit as u64).max(MIN_WINDOW)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the sweep window starts this poll.
    pub fn cursor(&self) -> u64 {
        self.state().cursor
    }

    /// The last poll's ranges, if its batch was full and it ran in the same second.
    pub fn reuse(&self, now: u64) -> Option<WindowRanges> {
        match self.state().reusable {
            Some((ranges, at)) if at == now => Some(ranges),
            _ => None,
        }
    }

    /// Records whether a poll at `now` over `ranges` filled its batch.
    pub fn finished(&self, ranges: WindowRanges, now: u64, full: bool) {
        self.state().reusable = full.then_some((ranges, now));
    }

    /// The ranges for bounds read at [`CandidateWindow::cursor`], and the cursor moved on
    /// by one window (back to the end of the head window once the sweep passed the
    /// newest queued row). With fewer queued rows than one window, the head covers them all.
    pub fn ranges(
        &self,
        cursor: u64,
        head_end: Option<u64>,
        sweep_end: Option<u64>,
    ) -> WindowRanges {
        let mut state = self.state();
        let Some(head_end) = head_end else {
            state.cursor = 0;
            return WindowRanges {
                head_end: u64::MAX,
                sweep_start: 0,
                sweep_end: 0,
            };
        };
        state.cursor = sweep_end.unwrap_or(head_end);
        WindowRanges {
            head_end,
            sweep_start: cursor.max(head_end),
            sweep_end: sweep_end.unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_condition_is_the_key_and_value() {
        assert_eq!(
            handed_over_sql!(),
            format!(r#"properties LIKE '%"{HANDOVER_KEY}":"{HANDOVER_VALUE}"%'"#)
        );
    }

    #[test]
    fn with_marker_adds_the_key_first() {
        assert_eq!(with_marker("{}"), r#"{"handedOverTo":"gorge-webhook"}"#);
        assert_eq!(
            with_marker(r#"{"retry":"never"}"#),
            r#"{"handedOverTo":"gorge-webhook","retry":"never"}"#
        );
        assert_eq!(with_marker("not json"), "not json");
    }

    /// The kit's PHP and this crate must agree on the marker, byte for byte.
    #[test]
    fn the_kit_writes_the_same_marker() {
        let php =
            include_str!("../../../compat/phorge/src/extensions/gorge/GorgeWebhookDelegation.php");
        assert!(
            php.contains(&format!("const HANDOVER_KEY = '{HANDOVER_KEY}';")),
            "GorgeWebhookDelegation::HANDOVER_KEY differs"
        );
        assert!(
            php.contains(&format!("const HANDOVER_VALUE = '{HANDOVER_VALUE}';")),
            "GorgeWebhookDelegation::HANDOVER_VALUE differs"
        );
    }

    #[test]
    fn ranges_are_reused_only_after_a_full_batch_in_the_same_second() {
        let window = CandidateWindow::default();
        let ranges = window.ranges(0, Some(1000), Some(2000));
        window.finished(ranges, 7, true);
        assert_eq!(window.reuse(7), Some(ranges));
        assert_eq!(window.reuse(8), None);
        window.finished(ranges, 7, false);
        assert_eq!(window.reuse(7), None);
    }

    #[test]
    fn a_short_queue_is_one_head_window() {
        let window = CandidateWindow::default();
        let ranges = window.ranges(0, None, None);
        assert_eq!(ranges.head_end, u64::MAX);
        assert_eq!(window.cursor(), 0);
    }

    #[test]
    fn the_sweep_moves_one_window_per_poll_and_wraps_after_the_head() {
        let window = CandidateWindow::default();
        // Head ends at id 1000, the sweep from 0 at 1000 too: it starts after the head.
        let r = window.ranges(0, Some(1000), Some(1000));
        assert_eq!((r.head_end, r.sweep_start, r.sweep_end), (1000, 1000, 1000));
        assert_eq!(window.cursor(), 1000);
        let r = window.ranges(1000, Some(1000), Some(2000));
        assert_eq!((r.sweep_start, r.sweep_end), (1000, 2000));
        assert_eq!(window.cursor(), 2000);
        // Past the newest queued row: this poll reaches the end, the next starts over.
        let r = window.ranges(2000, Some(1000), None);
        assert_eq!((r.sweep_start, r.sweep_end), (2000, u64::MAX));
        assert_eq!(window.cursor(), 1000);
    }
}
