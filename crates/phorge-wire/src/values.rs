//! Phorge's value domain for Herald webhooks, as the strings its PHP code stores.
//!
//! The service shares `herald_webhook` and `herald_webhookrequest` with Phorge, whose UI and
//! PHP code read these columns back; inventing a value would break them. Every enum here maps
//! 1:1 to the constants in `HeraldWebhookRequest` / `HeraldWebhook` and round-trips through
//! `as_str()` / `parse()`.

use std::fmt;

/// Declares a string-valued enum with `as_str`, `parse`, `ALL` and `Display`.
macro_rules! phorge_values {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in Phorge's declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The exact string Phorge stores.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// Parses the exact stored string; anything else is `None` (no case folding:
            /// Phorge compares these strings byte for byte).
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

phorge_values! {
    /// `herald_webhookrequest.status`.
    RequestStatus {
        /// Waiting for delivery (also a failed `retry=forever` request waiting to retry).
        Queued => "queued",
        /// Delivered with a 2xx answer.
        Sent => "sent",
        /// Given up: terminal error, or a failed `retry=never` request.
        Failed => "failed",
    }
}

phorge_values! {
    /// `herald_webhookrequest.lastRequestResult`.
    RequestResult {
        /// No HTTP request was made.
        None => "none",
        /// The last request got a 2xx answer.
        Okay => "okay",
        /// The last request failed (non-2xx, timeout, transport error).
        Fail => "fail",
    }
}

phorge_values! {
    /// `herald_webhook.status`.
    HookStatus {
        /// Fires for objects matched by Herald rules.
        Enabled => "enabled",
        /// Fires for every object.
        Firehose => "firehose",
        /// Never fires; queued requests for it fail with [`HookErrorCode::Disabled`].
        Disabled => "disabled",
    }
}

phorge_values! {
    /// The `errorType` property of a request.
    ErrorType {
        /// The request was not sent because of the hook or the request itself.
        Hook => "hook",
        /// An HTTP answer (the code is the status) or a transport failure.
        Http => "http",
        /// The whole-request timeout expired.
        Timeout => "timeout",
    }
}

phorge_values! {
    /// `errorCode` values that go with [`ErrorType::Hook`].
    HookErrorCode {
        /// The hook is disabled (`HeraldWebhookRequest::ERRORCODE_DISABLED`).
        Disabled => "disabled",
        /// The hook URI is not allowed by the outbound policy (`ERRORCODE_URI`).
        Uri => "uri",
        /// Phorge is in silent mode (`ERRORCODE_SILENT`); written by PHP only.
        Silent => "silent",
        /// The object could not be loaded (`ERRORCODE_OBJECT`); written by PHP only.
        Object => "object",
        /// The request's hook row does not exist (this service's own code).
        NotFound => "not-found",
        /// The request's `properties` column could not be parsed (this service's own code).
        InvalidProperties => "invalid-properties",
        /// The row cannot be used as stored (a PHID that is not UTF-8, a version the claim
        /// UPDATE cannot advance); this service's own code.
        InvalidRow => "invalid-row",
    }
}

phorge_values! {
    /// The `retry` property of a request.
    RetryMode {
        /// A failed request becomes `failed`.
        Never => "never",
        /// A failed request stays `queued` and is retried after the backoff.
        Forever => "forever",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Copy + PartialEq + fmt::Debug>(
        all: &[T],
        as_str: fn(T) -> &'static str,
        parse: fn(&str) -> Option<T>,
    ) -> Vec<&'static str> {
        all.iter()
            .map(|&value| {
                assert_eq!(parse(as_str(value)), Some(value));
                as_str(value)
            })
            .collect()
    }

    #[test]
    fn every_value_round_trips_with_phorge_spelling() {
        assert_eq!(
            round_trips(
                RequestStatus::ALL,
                RequestStatus::as_str,
                RequestStatus::parse
            ),
            ["queued", "sent", "failed"]
        );
        assert_eq!(
            round_trips(
                RequestResult::ALL,
                RequestResult::as_str,
                RequestResult::parse
            ),
            ["none", "okay", "fail"]
        );
        assert_eq!(
            round_trips(HookStatus::ALL, HookStatus::as_str, HookStatus::parse),
            ["enabled", "firehose", "disabled"]
        );
        assert_eq!(
            round_trips(ErrorType::ALL, ErrorType::as_str, ErrorType::parse),
            ["hook", "http", "timeout"]
        );
        assert_eq!(
            round_trips(
                HookErrorCode::ALL,
                HookErrorCode::as_str,
                HookErrorCode::parse
            ),
            [
                "disabled",
                "uri",
                "silent",
                "object",
                "not-found",
                "invalid-properties",
                "invalid-row"
            ]
        );
        assert_eq!(
            round_trips(RetryMode::ALL, RetryMode::as_str, RetryMode::parse),
            ["never", "forever"]
        );
    }

    #[test]
    fn parse_is_exact() {
        assert_eq!(RequestStatus::parse("Queued"), None);
        assert_eq!(RequestStatus::parse(" queued"), None);
        assert_eq!(RetryMode::parse(""), None);
        assert_eq!(HookStatus::Firehose.to_string(), "firehose");
    }
}
