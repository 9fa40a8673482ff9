//! What a delivery attempt (or a refusal to attempt) writes back into the row, in Phorge's
//! value domain only (docs/webhook.md, "Error codes"), and how it is counted.
//!
//! Pure functions: the dispatcher decides *whether* to write, this module decides *what*.

use gorge_claim::handover::with_marker;
use gorge_claim::ResultWrite;
use phorge_wire::values::{ErrorType, HookErrorCode, RequestResult, RequestStatus, RetryMode};
use phorge_wire::webhook::{ErrorCode, PropertiesError, RequestProperties};

use crate::delivery::DeliveryError;

/// Where a delivered (or not delivered) request ended up: the `outcome` label of
/// `gorge_webhook_deliveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// `sent`.
    Sent,
    /// Failed, stays `queued` for a retry (`retry=forever`).
    Retry,
    /// `failed` for good.
    Failed,
}

impl DeliveryOutcome {
    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Sent => "sent",
            DeliveryOutcome::Retry => "retry",
            DeliveryOutcome::Failed => "failed",
        }
    }
}

/// Why a candidate was passed over this round without being claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Another delivery of the same hook (this or another process) holds its lock.
    HookBusy,
    /// The hook's circuit breaker is open.
    BreakerOpen,
    /// The row is already being delivered by this process.
    InFlight,
}

impl SkipReason {
    /// The `reason` label of `gorge_webhook_skipped_total`.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::HookBusy => "hook-busy",
            SkipReason::BreakerOpen => "breaker-open",
            SkipReason::InFlight => "in-flight",
        }
    }
}

/// The class of an HTTP status for the deliveries metric.
pub fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// Why a row was failed with `invalid-row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidRowReason {
    /// A column of the request row is not readable (e.g. a PHID that is not UTF-8).
    Unreadable,
    /// The server kept rejecting a statement about the row (e.g. the claim UPDATE).
    Rejected,
    /// The row's hook has columns that are not readable.
    HookRow,
    /// The row's `properties` is longer than the service reads (`MAX_PROPERTIES_BYTES`, or
    /// the server's `max_allowed_packet`): failed without reading it.
    Oversized,
}

impl InvalidRowReason {
    /// The `reason` label of `gorge_webhook_invalid_rows_total`.
    pub fn label(self) -> &'static str {
        match self {
            InvalidRowReason::Unreadable => "unreadable",
            InvalidRowReason::Rejected => "rejected",
            InvalidRowReason::HookRow => "hook-row",
            InvalidRowReason::Oversized => "oversized",
        }
    }
}

/// The row update for an attempt, with the labels it is counted and logged under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub row: ResultWrite,
    pub outcome: DeliveryOutcome,
    /// The `class` label of the deliveries metric: the status class (`2xx`…), `hook`, or
    /// for a transport failure its readable reason (`connection-refused`, `timeout`…).
    pub class: &'static str,
    /// The `errorCode` written (the status, the cURL number or the hook code), for the log.
    pub code: String,
}

/// The decision for an HTTP attempt that ended at `epoch` with `result`.
///
/// 2xx → `sent`/`okay`/`http`/the status (the PHP worker records the status on success too).
/// Anything else → `fail`; `retry=forever` stays `queued`, everything else becomes `failed`.
/// Transport failures write the cURL error number Phorge's worker would (`7`, `28`…); a
/// redirect the outbound policy refused writes Phorge's `hook`/`uri` and is never retried.
pub fn after_attempt(
    properties: &RequestProperties,
    result: Result<u16, DeliveryError>,
    epoch: u64,
) -> Decision {
    let (error_type, code, class) = match result {
        Ok(status) => (
            ErrorType::Http,
            ErrorCode::from(status),
            status_class(status),
        ),
        Err(DeliveryError::BlockedRedirect) => (
            ErrorType::Hook,
            ErrorCode::from(HookErrorCode::Uri.as_str()),
            DeliveryError::BlockedRedirect.reason(),
        ),
        Err(err) => {
            let error_type = if err == DeliveryError::Timeout {
                ErrorType::Timeout
            } else {
                ErrorType::Http
            };
            let number = err.curl_code().unwrap_or_default();
            (error_type, ErrorCode::from(number), err.reason())
        }
    };
    let success = matches!(result, Ok(200..=299));
    let retry =
        properties.retry == RetryMode::Forever && result != Err(DeliveryError::BlockedRedirect);
    let (status, outcome) = match (success, retry) {
        (true, _) => (RequestStatus::Sent, DeliveryOutcome::Sent),
        (false, true) => (RequestStatus::Queued, DeliveryOutcome::Retry),
        (false, false) => (RequestStatus::Failed, DeliveryOutcome::Failed),
    };
    Decision {
        row: ResultWrite::Attempted {
            status,
            result: if success {
                RequestResult::Okay
            } else {
                RequestResult::Fail
            },
            epoch,
            properties: properties.rewritten(error_type, code.clone()),
        },
        outcome,
        class,
        code: code.to_string(),
    }
}

/// The `class` label of a failure decided before any request (Phorge's `hook` error type).
pub const NOT_ATTEMPTED: &str = "hook";

/// A terminal failure decided before any request: Phorge's `hook` error type with `code`
/// written into `properties` (every other key kept); `failed`, `none`, epoch 0.
pub fn without_attempt(code: HookErrorCode, properties: &RequestProperties) -> Decision {
    not_attempted(code, properties.rewritten(ErrorType::Hook, code.as_str()))
}

/// [`without_attempt`] for a `properties` column that could not be parsed: `properties` is
/// the complete new column text (see [`PropertiesError::rewritten_with`]).
pub fn not_attempted(code: HookErrorCode, properties: String) -> Decision {
    Decision {
        row: ResultWrite::NotAttempted { properties },
        outcome: DeliveryOutcome::Failed,
        class: NOT_ATTEMPTED,
        code: code.as_str().to_string(),
    }
}

/// The `properties` text for an `invalid-row` failure: every readable key kept. Text that
/// was not read (not UTF-8, too long) is replaced by the error keys after the hand-over
/// marker, so the row still says whose it is.
pub fn invalid_row_properties(text: Option<&str>) -> String {
    let code = HookErrorCode::InvalidRow;
    match text.map(RequestProperties::parse) {
        Some(Ok(properties)) => properties.rewritten(ErrorType::Hook, code.as_str()),
        Some(Err(err)) => err.rewritten_with(code),
        None => with_marker(&PropertiesError::NotAnObject.rewritten_with(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsFailure;

    fn props(retry: &str) -> RequestProperties {
        RequestProperties::parse(&format!(r#"{{"retry":"{retry}","x":1}}"#)).unwrap()
    }

    #[test]
    fn success_is_sent_okay_with_the_status_as_an_integer() {
        let d = after_attempt(&props("never"), Ok(204), 7);
        assert_eq!(d.row.status(), RequestStatus::Sent);
        assert_eq!(d.row.result(), RequestResult::Okay);
        assert_eq!(d.row.epoch(), Some(7));
        assert_eq!(
            d.row.properties(),
            r#"{"retry":"never","x":1,"errorType":"http","errorCode":204}"#
        );
        assert_eq!((d.outcome, d.class), (DeliveryOutcome::Sent, "2xx"));
    }

    #[test]
    fn failures_follow_the_retry_mode() {
        let d = after_attempt(&props("forever"), Ok(503), 9);
        assert_eq!(
            (d.row.status(), d.row.result(), d.outcome, d.class),
            (
                RequestStatus::Queued,
                RequestResult::Fail,
                DeliveryOutcome::Retry,
                "5xx"
            )
        );
        let d = after_attempt(&props("never"), Ok(302), 9);
        assert_eq!((d.row.status(), d.class), (RequestStatus::Failed, "3xx"));
        // An unknown retry mode never retries, as in the PHP worker.
        let d = after_attempt(&props("sometimes"), Ok(500), 9);
        assert_eq!(d.row.status(), RequestStatus::Failed);
    }

    #[test]
    fn transport_failures_write_curl_numbers_and_keep_the_reason_for_logs() {
        let d = after_attempt(&props("never"), Err(DeliveryError::Timeout), 1);
        assert!(d
            .row
            .properties()
            .ends_with(r#""errorType":"timeout","errorCode":28}"#));
        assert_eq!(d.class, "timeout");
        let d = after_attempt(&props("forever"), Err(DeliveryError::ConnectionRefused), 1);
        assert!(d
            .row
            .properties()
            .ends_with(r#""errorType":"http","errorCode":7}"#));
        assert_eq!(
            (d.row.status(), d.class, d.code.as_str()),
            (RequestStatus::Queued, "connection-refused", "7")
        );
        let d = after_attempt(
            &props("never"),
            Err(DeliveryError::Tls(TlsFailure::UntrustedCertificate)),
            1,
        );
        assert!(d.row.properties().ends_with(r#""errorCode":60}"#));
        assert_eq!(d.class, "certificate-not-trusted");
    }

    #[test]
    fn a_blocked_redirect_is_phorges_uri_error_and_is_not_retried() {
        let d = after_attempt(&props("forever"), Err(DeliveryError::BlockedRedirect), 3);
        assert_eq!(
            (d.row.status(), d.row.result(), d.row.epoch()),
            (RequestStatus::Failed, RequestResult::Fail, Some(3))
        );
        assert!(d
            .row
            .properties()
            .ends_with(r#""errorType":"hook","errorCode":"uri"}"#));
    }

    #[test]
    fn terminal_failures_write_no_epoch() {
        let d = without_attempt(HookErrorCode::Disabled, &props("never"));
        assert_eq!(
            (d.row.status(), d.row.result(), d.row.epoch(), d.class),
            (RequestStatus::Failed, RequestResult::None, None, "hook")
        );
        assert_eq!(d.code, "disabled");
        assert_eq!(
            d.row.properties(),
            r#"{"retry":"never","x":1,"errorType":"hook","errorCode":"disabled"}"#
        );
    }
}
