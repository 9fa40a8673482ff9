//! What lands in the row (and on the wire) for every kind of outcome, driven in-process with
//! an injected clock so `lastRequestEpoch` is exact. Issue #3 tests 5 (wire fidelity) and 6.

mod common;

use std::time::Duration;

use common::Harness;
use gorge_claim::testdb::{with_marker, HookStatus, NewRequest, RequestRow, TestDb};
use gorge_testkit::{CapturedLog, Receiver, Reply};
use gorge_webhook::clock::ManualUnixClock;
use gorge_webhook::metrics::Metrics;
use gorge_webhook::outcome::DeliveryOutcome;
use gorge_webhook::policy::{OutboundPolicy, Resolver};
use phorge_wire::webhook::{sign, RequestProperties, WebhookPayload};

/// When the rows were inserted (`dateCreated`, the payload's `epoch`).
const T0: u64 = 1_700_000_000;
/// When the dispatcher runs: later than the insert, so the claim version `max(seen + 1,
/// now)` is `NOW` and every written epoch is exactly `NOW`.
const NOW: u64 = T0 + 10;
const KEY: &str = "abcdefghijklmnopqrstuvwxyz012345";

/// Properties with an unknown key, the object form of `transactionPHIDs` and a stale
/// `errorCode`, in an order that must survive.
const RICH: &str = r#"{"retry":"never","transactionPHIDs":{"12":"PHID-XACT-TASK-bbbbbbbbbbbbbbb","7":"PHID-XACT-TASK-aaaaaaaaaaaaaaa"},"triggerPHIDs":["PHID-HRUL-aaaaaaaaaaaaaaaaaaaa"],"silent":false,"secure":true,"test":true,"custom":{"nested":[1,2.5,"x"]},"errorCode":"old"}"#;

/// `code` is the JSON text of `errorCode`: `200` (an integer, as Phorge writes statuses and
/// cURL numbers) or `"uri"` (a hook code).
fn rich_after(error_type: &str, code: &str) -> String {
    format!(
        r#"{{"retry":"never","transactionPHIDs":{{"12":"PHID-XACT-TASK-bbbbbbbbbbbbbbb","7":"PHID-XACT-TASK-aaaaaaaaaaaaaaa"}},"triggerPHIDs":["PHID-HRUL-aaaaaaaaaaaaaaaaaaaa"],"silent":false,"secure":true,"test":true,"custom":{{"nested":[1,2.5,"x"]}},"errorCode":{code},"errorType":"{error_type}"}}"#
    )
}

fn with_retry(retry: &str) -> String {
    format!(
        r#"{{"retry":"{retry}","transactionPHIDs":["PHID-XACT-TASK-aaaaaaaaaaaaaaa"],"triggerPHIDs":[],"silent":false,"secure":false,"test":false}}"#
    )
}

fn with_retry_after(retry: &str, error_type: &str, code: &str) -> String {
    format!(
        r#"{{"retry":"{retry}","transactionPHIDs":["PHID-XACT-TASK-aaaaaaaaaaaaaaa"],"triggerPHIDs":[],"silent":false,"secure":false,"test":false,"errorType":"{error_type}","errorCode":{code}}}"#
    )
}

struct Case {
    db: TestDb,
    /// [`TestDb::hook_phid`]: the per-hook lock is server-wide.
    hook: String,
    clock: ManualUnixClock,
    log: CapturedLog,
}

impl Case {
    async fn new() -> Case {
        let db = TestDb::create().await.unwrap();
        Case {
            hook: db.hook_phid(),
            db,
            clock: ManualUnixClock::new(NOW),
            log: CapturedLog::default(),
        }
    }

    /// A case whose hook posts to `uri`, signing with [`KEY`].
    async fn with_hook(uri: &str, status: HookStatus) -> Case {
        let case = Case::new().await;
        case.db
            .insert_hook(&case.hook, uri, status, KEY)
            .await
            .unwrap();
        case
    }

    /// `rounds` poll rounds of a dispatcher built from `harness` (one row of a hook is
    /// worked on at a time, so each of a hook's rows needs its own round); its metrics.
    async fn rounds(&self, harness: Harness, rounds: usize) -> Metrics {
        let (dispatcher, metrics) = harness.build(&self.db, &self.clock, &self.log);
        for _ in 0..rounds {
            dispatcher.run_round().await.unwrap();
        }
        metrics
    }

    async fn assert_row(&self, id: u64, state: RowState, properties: &str) {
        assert_row(&self.row(id).await, state, properties);
    }

    async fn request(&self, properties: &str) -> u64 {
        let request =
            NewRequest::new(&self.hook, "PHID-TASK-outcomeobject00000").with_properties(properties);
        self.db.insert_request(&request, T0).await.unwrap()
    }

    async fn row(&self, id: u64) -> RequestRow {
        self.db.read_request(id).await.unwrap()
    }

    async fn finish(self) {
        self.db.drop_database().await;
    }
}

/// `status`, `lastRequestResult` and `lastRequestEpoch` of a row after a round.
type RowState = (&'static str, &'static str, u64);
/// Delivered at `NOW`.
const SENT: RowState = ("sent", "okay", NOW);
/// Attempted at `NOW`, queued again to retry.
const RETRY: RowState = ("queued", "fail", NOW);
/// Attempted at `NOW` and given up.
const FAILED: RowState = ("failed", "fail", NOW);
/// Given up without an HTTP request.
const FAILED_UNSENT: RowState = ("failed", "none", 0);

/// `properties` is the text expected after the write for a row queued with `properties`
/// before; every row here was handed over, and the marker the kit put first stays first.
fn assert_row(row: &RequestRow, state: RowState, properties: &str) {
    assert_stored(row, state, &with_marker(properties));
}

fn assert_stored(row: &RequestRow, (status, result, epoch): RowState, properties: &str) {
    assert_eq!(
        (
            row.status.as_str(),
            row.last_request_result.as_str(),
            row.last_request_epoch,
            row.properties.as_str()
        ),
        (status, result, epoch, properties),
        "row {}",
        row.id
    );
}

#[tokio::test]
async fn success_writes_sent_okay_http_200_and_preserves_every_key() {
    let receiver = Receiver::start(200);
    let case = Case::with_hook(&receiver.url("/hook"), HookStatus::Enabled).await;
    let id = case.request(RICH).await;
    let (dispatcher, metrics) = Harness::default().build(&case.db, &case.clock, &case.log);
    let round = dispatcher.run_round().await.unwrap();
    assert_eq!(round.started, 1);

    let row = case.row(id).await;
    assert_row(&row, SENT, &rich_after("http", "200"));
    assert_eq!(
        row.date_modified, NOW,
        "result marker: dateModified = lastRequestEpoch"
    );
    assert_eq!(receiver.count(), 1);
    assert_eq!(metrics.claims(true), 1);
    assert_eq!(metrics.deliveries(DeliveryOutcome::Sent, "2xx"), 1);
    assert_eq!(case.log.count("WEBHOOK_DELIVERED"), 1);
    case.finish().await;
}

#[tokio::test]
async fn wire_bytes_signature_and_headers_are_phorges() {
    let receiver = Receiver::start(200);
    let case = Case::with_hook(&receiver.url("/hook?x=1"), HookStatus::Firehose).await;
    case.request(RICH).await;
    case.rounds(Harness::default(), 1).await;
    let got = receiver.requests();
    assert_eq!(got.len(), 1, "{:?}", case.log.events());
    let request = &got[0];
    // The exact bytes, pinned independently of the encoder: object values of
    // transactionPHIDs in order, epoch = dateCreated, flags from properties, one newline.
    let expected = "{\n  \"object\": {\n    \"type\": \"TASK\",\n    \"phid\": \"PHID-TASK-outcomeobject00000\"\n  },\n  \"triggers\": [\n    {\n      \"phid\": \"PHID-HRUL-aaaaaaaaaaaaaaaaaaaa\"\n    }\n  ],\n  \"action\": {\n    \"test\": true,\n    \"silent\": false,\n    \"secure\": true,\n    \"epoch\": 1700000000\n  },\n  \"transactions\": [\n    {\n      \"phid\": \"PHID-XACT-TASK-bbbbbbbbbbbbbbb\"\n    },\n    {\n      \"phid\": \"PHID-XACT-TASK-aaaaaaaaaaaaaaa\"\n    }\n  ]\n}\n";
    assert_eq!(String::from_utf8(request.body.clone()).unwrap(), expected);
    let payload = WebhookPayload::from_properties(
        "PHID-TASK-outcomeobject00000",
        &RequestProperties::parse(RICH).unwrap(),
        T0,
    );
    assert_eq!(request.body, payload.encode_body());
    assert_eq!(
        request.header("x-phabricator-webhook-signature"),
        Some(sign(KEY.as_bytes(), expected.as_bytes()).as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.header("user-agent"),
        Some(format!("gorge-webhook/{}", env!("CARGO_PKG_VERSION")).as_str())
    );
    assert_eq!(
        request.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/hook?x=1")
    );
    case.finish().await;
}

#[tokio::test]
async fn http_500_stays_queued_with_forever_and_fails_with_never() {
    let receiver = Receiver::start(500);
    let case = Case::with_hook(&receiver.url("/hook"), HookStatus::Enabled).await;
    let forever = case.request(&with_retry("forever")).await;
    let never = case.request(&with_retry("never")).await;
    let metrics = case.rounds(Harness::default(), 2).await;
    case.assert_row(forever, RETRY, &with_retry_after("forever", "http", "500"))
        .await;
    case.assert_row(never, FAILED, &with_retry_after("never", "http", "500"))
        .await;
    assert_eq!(receiver.count(), 2);
    assert_eq!(metrics.deliveries(DeliveryOutcome::Retry, "5xx"), 1);
    assert_eq!(metrics.deliveries(DeliveryOutcome::Failed, "5xx"), 1);
    case.finish().await;
}

#[tokio::test]
async fn timeout_is_error_type_timeout() {
    let receiver = Receiver::with(|_, _| Reply::Delay(Duration::from_secs(3), 200));
    let case = Case::with_hook(&receiver.url("/slow"), HookStatus::Enabled).await;
    let id = case.request(&with_retry("never")).await;
    case.rounds(
        Harness {
            timeout: Duration::from_secs(1),
            ..Harness::default()
        },
        1,
    )
    .await;
    case.assert_row(id, FAILED, &with_retry_after("never", "timeout", "28"))
        .await;
    case.finish().await;
}

#[tokio::test]
async fn connection_refused_is_curl_7() {
    let refused = gorge_testkit::RefusedPort::new();
    let case = Case::with_hook(
        &format!("http://127.0.0.1:{}/gone", refused.port()),
        HookStatus::Enabled,
    )
    .await;
    let id = case.request(&with_retry("forever")).await;
    case.rounds(Harness::default(), 1).await;
    case.assert_row(id, RETRY, &with_retry_after("forever", "http", "7"))
        .await;
    assert_eq!(
        case.log.count("WEBHOOK_POSTED"),
        1,
        "an attempt that connects nowhere"
    );
    case.finish().await;
}

#[tokio::test]
async fn an_unresolvable_host_is_curl_6_written_after_the_claim_without_a_post() {
    let case = Case::with_hook("http://nowhere.test/hook", HookStatus::Enabled).await;
    let id = case.request(&with_retry("forever")).await;
    // A resolver that knows no name: the lookup fails at once, whatever the machine's DNS.
    let nothing_resolves = OutboundPolicy::parse("")
        .unwrap()
        .with_resolver(Resolver::Fixed(Default::default()));
    let metrics = case
        .rounds(
            Harness {
                policy: nothing_resolves,
                ..Harness::default()
            },
            1,
        )
        .await;
    case.assert_row(id, RETRY, &with_retry_after("forever", "http", "6"))
        .await;
    assert_eq!(metrics.claims(true), 1);
    assert_eq!(metrics.deliveries(DeliveryOutcome::Retry, "dns"), 1);
    assert_eq!(metrics.policy_blocks.get(), 0, "not refused by the policy");
    assert_eq!(case.log.count("WEBHOOK_POLICY_BLOCKED"), 0);
    assert_eq!(case.log.count("WEBHOOK_POSTED"), 0, "no request was made");
    case.finish().await;
}

#[tokio::test]
async fn disabled_and_missing_hooks_fail_without_a_request() {
    let receiver = Receiver::start(200);
    let case = Case::with_hook(&receiver.url("/hook"), HookStatus::Disabled).await;
    let disabled = case.request(RICH).await;
    // A hook of this namespace that was never inserted: its lock name is this test's alone.
    let never_inserted = case.db.tagged_hook_phid("doesnotexist");
    let request = NewRequest::new(&never_inserted, "PHID-TASK-x").with_properties(RICH);
    let missing = case.db.insert_request(&request, T0).await.unwrap();
    let metrics = case.rounds(Harness::default(), 1).await;
    case.assert_row(
        disabled,
        FAILED_UNSENT,
        &rich_after("hook", r#""disabled""#),
    )
    .await;
    case.assert_row(
        missing,
        FAILED_UNSENT,
        &rich_after("hook", r#""not-found""#),
    )
    .await;
    assert_eq!(receiver.count(), 0);
    assert_eq!(
        metrics.claims(true),
        2,
        "terminal failures are written only after a claim"
    );
    assert_eq!(metrics.deliveries(DeliveryOutcome::Failed, "hook"), 2);
    case.finish().await;
}

#[tokio::test]
async fn unparsable_properties_fail_with_invalid_properties() {
    let receiver = Receiver::start(200);
    let case = Case::with_hook(&receiver.url("/hook"), HookStatus::Enabled).await;
    let garbage = case.request("{not json").await;
    let bad_field = case
        .request(r#"{"retry":"forever","transactionPHIDs":"PHID-XACT-TASK-x","keep":1}"#)
        .await;
    case.rounds(Harness::default(), 2).await;
    // Nothing of unparsable text can be kept, not even the marker (the row is failed).
    assert_stored(
        &case.row(garbage).await,
        FAILED_UNSENT,
        r#"{"errorType":"hook","errorCode":"invalid-properties"}"#,
    );
    case.assert_row(bad_field, FAILED_UNSENT, r#"{"retry":"forever","transactionPHIDs":"PHID-XACT-TASK-x","keep":1,"errorType":"hook","errorCode":"invalid-properties"}"#).await;
    assert_eq!(receiver.count(), 0);
    case.finish().await;
}

#[tokio::test]
async fn blocked_private_address_fails_with_hook_uri() {
    let receiver = Receiver::start(200);
    let case = Case::with_hook(&receiver.url("/hook"), HookStatus::Enabled).await;
    let id = case.request(RICH).await;
    let metrics = case
        .rounds(
            Harness {
                policy: OutboundPolicy::phorge_default(),
                ..Harness::default()
            },
            1,
        )
        .await;
    case.assert_row(id, FAILED_UNSENT, &rich_after("hook", r#""uri""#))
        .await;
    assert_eq!(
        receiver.count(),
        0,
        "a blocked address is never connected to"
    );
    assert_eq!(metrics.policy_blocks.get(), 1);
    assert_eq!(case.log.count("WEBHOOK_POLICY_BLOCKED"), 1);
    case.finish().await;
}

#[tokio::test]
async fn redirect_to_a_blocked_address_fails_and_allowed_redirects_are_followed() {
    let case = Case::new().await;
    let receiver = Receiver::with(|request, _| match request.path.as_str() {
        "/to-private" => Reply::Redirect(302, "http://10.1.2.3/steal".into()),
        "/to-307" => Reply::Redirect(307, "/final".into()),
        "/to-303" => Reply::Redirect(303, "/final".into()),
        _ => Reply::Status(204),
    });
    // Loopback is allowed here; 10.0.0.0/8 is not.
    let policy = OutboundPolicy::parse("10.0.0.0/8").unwrap();
    let mut ids = Vec::new();
    for path in ["/to-private", "/to-307", "/to-303"] {
        let phid = format!("{}{}", case.hook, path.replace('/', "-"));
        case.db
            .insert_hook(&phid, &receiver.url(path), HookStatus::Enabled, KEY)
            .await
            .unwrap();
        let request = NewRequest::new(&phid, "PHID-TASK-redirected0000000").with_properties(RICH);
        ids.push(case.db.insert_request(&request, T0).await.unwrap());
    }
    let metrics = case
        .rounds(
            Harness {
                policy,
                ..Harness::default()
            },
            1,
        )
        .await;
    case.assert_row(ids[0], FAILED, &rich_after("hook", r#""uri""#))
        .await;
    case.assert_row(ids[1], SENT, &rich_after("http", "204"))
        .await;
    case.assert_row(ids[2], SENT, &rich_after("http", "204"))
        .await;
    assert_eq!(metrics.policy_blocks.get(), 1);
    let finals: Vec<(String, usize, bool)> = receiver
        .requests()
        .iter()
        .filter(|r| r.path == "/final")
        .map(|r| {
            (
                r.method.clone(),
                r.body.len(),
                r.header("content-length").is_some(),
            )
        })
        .collect();
    assert_eq!(finals.len(), 2);
    // As Phorge's cURL call: 307 re-POSTs the body; 303 continues as a POST without a body
    // (and without Content-Length), keeping Content-Type and the signature.
    assert!(
        finals
            .iter()
            .any(|(m, len, cl)| m == "POST" && *len > 0 && *cl),
        "{finals:?}"
    );
    assert!(
        finals.contains(&("POST".to_string(), 0, false)),
        "{finals:?}"
    );
    for request in receiver.requests().iter().filter(|r| r.path == "/final") {
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(
            request
                .header("x-phabricator-webhook-signature")
                .map(str::len),
            Some(64)
        );
    }
    assert!(receiver
        .requests()
        .iter()
        .all(|r| !r.path.contains("steal")));
    case.finish().await;
}

#[tokio::test]
async fn redirect_loops_stop_after_twenty_hops_with_curl_47() {
    let receiver = Receiver::with(|_, _| Reply::Redirect(308, "/again".into()));
    let case = Case::with_hook(&receiver.url("/start"), HookStatus::Enabled).await;
    let id = case.request(&with_retry("never")).await;
    case.rounds(Harness::default(), 1).await;
    case.assert_row(id, FAILED, &with_retry_after("never", "http", "47"))
        .await;
    assert_eq!(
        receiver.count(),
        21,
        "the first request and twenty redirects"
    );
    case.finish().await;
}

#[tokio::test]
async fn long_response_bodies_are_read_only_up_to_the_bound_and_counted() {
    let receiver = Receiver::with(|_, _| Reply::Sized(200, 200 * 1024));
    let case = Case::with_hook(&receiver.url("/chatty"), HookStatus::Enabled).await;
    let id = case.request(&with_retry("never")).await;
    let metrics = case.rounds(Harness::default(), 1).await;
    case.assert_row(id, SENT, &with_retry_after("never", "http", "200"))
        .await;
    assert_eq!(metrics.response_bodies_truncated.get(), 1);
    case.finish().await;
}

#[tokio::test]
async fn ports_above_65535_are_a_uri_failure_not_port_80() {
    // Issue 9 W6: `http` parsed `:65536` as "no port", and the POST went to port 80.
    let case = Case::new().await;
    let mut ids = Vec::new();
    for port in ["65536", "99999"] {
        let phid = format!("{}-{port}", case.hook);
        case.db
            .insert_hook(
                &phid,
                &format!("http://127.0.0.1:{port}/hook"),
                HookStatus::Enabled,
                KEY,
            )
            .await
            .unwrap();
        let request = NewRequest::new(&phid, "PHID-TASK-badport000000000").with_properties(RICH);
        ids.push(case.db.insert_request(&request, T0).await.unwrap());
    }
    let metrics = case.rounds(Harness::default(), 1).await;
    for id in ids {
        case.assert_row(id, FAILED_UNSENT, &rich_after("hook", r#""uri""#))
            .await;
    }
    assert_eq!(metrics.deliveries(DeliveryOutcome::Failed, "hook"), 2);
    case.finish().await;
}
