//! The real binary: no duplicate while a POST is in flight, starting before the database
//! exists, the HTTP API, SIGTERM draining, a second copy on the same status port
//! (configuration: tests/config.rs).

mod common;

use std::time::Duration;

use common::{enabled_hook, run_binary, unix_now, Service};
use gorge_claim::testdb::{
    unique_namespace, HookStatus, NewRequest, RequestResult, RequestStatus, TestDb,
};
use gorge_testkit::{eventually, Process, Receiver, Reply};

const NOW: u64 = 1_700_000_000;

async fn status_of(db: &TestDb, id: u64) -> RequestStatus {
    db.read_request(id).await.unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_post_while_the_receiver_holds_it_and_the_poller_ticks() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::with(|_, _| Reply::Delay(Duration::from_secs(3), 200));
    let hook = enabled_hook(&db, &receiver.url("/slow")).await;
    let id = db
        .insert_request(&NewRequest::new(&hook, "PHID-TASK-x"), unix_now())
        .await
        .unwrap();
    let service = Service::start(db.namespace(), &[("GORGE_WEBHOOK_POLL_INTERVAL_MS", "100")]);

    eventually(Duration::from_secs(30), "the POST arrives", || async {
        receiver.count() >= 1
    })
    .await;
    // The poller keeps ticking while the receiver holds the POST (3 s), and sends nothing
    // more for the row it has claimed.
    service.wait_polls(3).await;
    assert_eq!(receiver.count(), 1);
    eventually(Duration::from_secs(30), "row sent", || async {
        status_of(&db, id).await == RequestStatus::Sent
    })
    .await;
    // A few more rounds now that it is done.
    service.wait_polls(3).await;
    assert_eq!(receiver.count(), 1);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_before_the_database_exists_and_delivers_once_it_does() {
    let namespace = unique_namespace();
    let service = Service::start(&namespace, &[]);

    let (status, body) = service.get("/readyz", &[]);
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "unavailable");
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("{namespace}_herald")), "{reason}");
    assert_eq!(service.get("/healthz", &[]).0, 200);

    // Phorge runs `bin/storage upgrade` later; no restart.
    let db = TestDb::create_in(&namespace).await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/late")).await;
    db.insert_request(&NewRequest::new(&hook, "PHID-TASK-late"), unix_now())
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "ready", || async {
        service.get("/readyz", &[]).0 == 200
    })
    .await;
    let requests = receiver.wait_for(1, Duration::from_secs(30));
    assert_eq!(requests[0].object_phid(), "PHID-TASK-late");
    db.drop_database().await;
}

/// Forwards every connection on `listener` to `target` (a stand-in for MariaDB coming up).
fn forward(listener: std::net::TcpListener, target: String) {
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(&target) else {
                continue;
            };
            let (mut client_read, mut server_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut server_read, mut client_write) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_read, &mut server_write);
                let _ = server_write.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut server_read, &mut client_write);
                let _ = client_write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_while_mariadb_is_unreachable_and_recovers_without_restart() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/later")).await;
    let id = db
        .insert_request(&NewRequest::new(&hook, "PHID-TASK-later"), unix_now())
        .await
        .unwrap();
    // Nothing answers on the database port until the test listens on it.
    let database_port = gorge_testkit::RefusedPort::new();
    let port_text = database_port.port().to_string();
    let mut service = Service::start(
        db.namespace(),
        &[
            ("GORGE_WEBHOOK_MYSQL_HOST", "127.0.0.1"),
            ("GORGE_WEBHOOK_MYSQL_PORT", port_text.as_str()),
        ],
    );
    let (status, body) = service.get("/readyz", &[]);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with(r#"{"status":"unavailable","reason":""#),
        "{body}"
    );
    assert_eq!(service.process.try_wait(), None, "still running");
    let metrics = service.get("/metrics", &[]).1;
    assert!(metrics.contains("\ngorge_webhook_db_up 0\n"), "{metrics}");

    // The server "comes up" on the configured address.
    let opts = gorge_claim::testdb::server_opts();
    let listener = database_port.listen();
    forward(
        listener,
        format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port()),
    );
    eventually(Duration::from_secs(60), "ready and delivered", || async {
        service.get("/readyz", &[]).0 == 200 && status_of(&db, id).await == RequestStatus::Sent
    })
    .await;
    assert_eq!(receiver.count(), 1);
    // Sampled every 5 s.
    eventually(Duration::from_secs(20), "db_up 1", || async {
        service
            .get("/metrics", &[])
            .1
            .contains("\ngorge_webhook_db_up 1\n")
    })
    .await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_counts_with_token_in_header_or_query() {
    let db = TestDb::create().await.unwrap();
    let hook = enabled_hook(&db, "http://127.0.0.1:9/").await;
    db.insert_hook(
        &format!("{hook}-off"),
        "http://127.0.0.1:9/",
        HookStatus::Disabled,
        "k",
    )
    .await
    .unwrap();
    // Rows the service will not touch: a future backoff keeps the queued one queued.
    let rows: Vec<NewRequest> = [
        ("PHID-HWBR-a", RequestStatus::Queued, u32::MAX as u64 - 1),
        ("PHID-HWBR-b", RequestStatus::Sent, NOW),
        ("PHID-HWBR-c", RequestStatus::Sent, NOW),
        ("PHID-HWBR-d", RequestStatus::Failed, NOW),
    ]
    .into_iter()
    .map(|(phid, status, epoch)| {
        NewRequest::new(&hook, "PHID-TASK-x")
            .with_phid(phid)
            .with_properties("{}")
            .attempted(status, RequestResult::Fail, epoch)
    })
    .collect();
    db.insert_requests(&rows, NOW).await.unwrap();
    let service = Service::start(db.namespace(), &[("GORGE_SERVICE_TOKEN", "s3cret/+")]);
    let stats = r#"{"data":{"queuedCount":1,"sentCount":2,"failedCount":1,"activeWebhooks":1}}"#;

    assert_eq!(
        service.get("/api/webhook/stats", &[("X-Service-Token", "s3cret/+")]),
        (200, stats.to_string())
    );
    assert_eq!(
        service.get("/api/webhook/stats?token=s3cret%2F%2B", &[]),
        (200, stats.to_string())
    );
    assert_eq!(
        service.get("/api/webhook/hooks?token=s3cret%2F%2B", &[]),
        (200, r#"{"data":{"total":2}}"#.to_string())
    );
    let unauthorized = (
        401,
        r#"{"error":{"code":"ERR_UNAUTHORIZED","message":"missing or invalid service token"}}"#
            .to_string(),
    );
    assert_eq!(service.get("/api/webhook/stats", &[]), unauthorized);
    assert_eq!(
        service.get("/api/webhook/stats", &[("X-Service-Token", "wrong")]),
        unauthorized
    );
    // The header wins when both are present, even when the query is right.
    assert_eq!(
        service.get(
            "/api/webhook/stats?token=s3cret%2F%2B",
            &[("X-Service-Token", "wrong")]
        ),
        unauthorized
    );
    let (status, body) = service.get("/api/webhook/nope", &[("X-Service-Token", "s3cret/+")]);
    assert_eq!(status, 404);
    assert!(body.contains("ERR_NOT_FOUND"), "{body}");
    let (status, metrics) = service.get("/metrics", &[]);
    assert_eq!(status, 200);
    for name in [
        "gorge_webhook_claims_total",
        "gorge_webhook_attempt_duration_seconds",
        "gorge_webhook_breaker_open_hooks",
        "gorge_webhook_policy_blocks_total",
        "gorge_webhook_queue_depth",
        "gorge_webhook_oldest_queued_age_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    assert_eq!(
        service.get("/readyz", &[]),
        (200, r#"{"status":"ok"}"#.to_string())
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_answers_405_and_hides_database_errors() {
    let namespace = unique_namespace();
    let service = Service::start(&namespace, &[]);
    let (status, body) = service.get("/api/webhook/stats", &[]);
    assert_eq!(
        (status, body.as_str()),
        (
            500,
            r#"{"error":{"code":"ERR_INTERNAL","message":"internal error"}}"#
        )
    );
    let mut stream = std::net::TcpStream::connect(service.status_addr).unwrap();
    use std::io::{Read, Write};
    stream
        .write_all(b"POST /api/webhook/stats HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
    assert!(response.contains("ERR_METHOD_NOT_ALLOWED"), "{response}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_inflight_delivery_write_its_result() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let hook = enabled_hook(&db, &receiver.url("/held")).await;
    let id = db
        .insert_request(&NewRequest::new(&hook, "PHID-TASK-x"), unix_now())
        .await
        .unwrap();
    let mut service = Service::start(db.namespace(), &[]);
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(1, Duration::from_secs(30)))
        .await
        .unwrap();
    service.terminate();
    // Draining: readiness is off while the POST is still held.
    eventually(Duration::from_secs(10), "readyz draining", || async {
        service.get("/readyz", &[]).0 == 503
    })
    .await;
    assert_eq!(status_of(&db, id).await, RequestStatus::Queued);
    receiver.release();
    assert_eq!(service.process.exited().await.code(), Some(0));
    assert_eq!(
        status_of(&db, id).await,
        RequestStatus::Sent,
        "result written before the pool closed"
    );
    db.drop_database().await;
}

#[test]
fn a_busy_listen_address_is_a_startup_failure() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, _, stderr) = run_binary(
        &[],
        &[
            ("GORGE_LISTEN_ADDR", addr.as_str()),
            ("GORGE_WEBHOOK_MYSQL_PORT", "1"),
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&addr), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_subcommand_probes_the_status_port() {
    let namespace = unique_namespace();
    let service = Service::start(&namespace, &[]);
    let port = service.status_addr.port().to_string();
    let (code, _, stderr) = run_binary(&["healthcheck", "--port", &port], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    // The port also comes from GORGE_LISTEN_ADDR when --port is absent.
    let addr = service.status_addr.to_string();
    let (code, _, _) = run_binary(&["healthcheck"], &[("GORGE_LISTEN_ADDR", addr.as_str())]);
    assert_eq!(code, Some(0));
    let closed = gorge_testkit::RefusedPort::new();
    let port = closed.port().to_string();
    let (code, _, _) = run_binary(&["healthcheck", "--port", &port], &[]);
    assert_eq!(code, Some(1));
}

#[test]
fn version_and_help() {
    let (code, stdout, _) = run_binary(&["--version"], &[]);
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout.trim(),
        format!("gorge-webhook {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, stdout, _) = run_binary(&["--help"], &[]);
    assert_eq!(code, Some(0));
    for word in ["--config", "--check-config", "healthcheck"] {
        assert!(stdout.contains(word), "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_is_refused_while_the_first_serves_and_takes_over_while_it_drains() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::with(|_, _| Reply::Hold(200));
    let hook = enabled_hook(&db, &receiver.url("/held")).await;
    db.insert_request(&NewRequest::new(&hook, "PHID-TASK-x"), unix_now())
        .await
        .unwrap();
    let mut first = Service::start(db.namespace(), &[]);
    let pid = first.process.id();
    let start_second =
        || Process::spawn_keeping_stderr(Service::command(db.namespace(), first.status_addr, &[]));

    // Serving (whether its readiness says ready or not yet): refused, one line.
    let mut refused = start_second();
    assert_eq!(refused.exited().await.code(), Some(1));
    let stderr = refused.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "gorge-webhook: another copy (pid {pid}) is already serving on {}",
            first.status_addr
        )),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("kill -TERM {pid}")), "{stderr}");
    assert!(refused.log_events("LISTENING").is_empty());

    // Draining (its delivery held by the receiver): the second copy binds beside it.
    let waiting = receiver.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for(1, Duration::from_secs(30)))
        .await
        .unwrap();
    first.terminate();
    eventually(Duration::from_secs(10), "readyz draining", || async {
        first.get("/readyz", &[]).1 == r#"{"status":"draining"}"#
    })
    .await;
    let second = start_second();
    assert!(
        second
            .wait_for_event("LISTENING", gorge_testkit::PATIENCE)
            .is_some(),
        "the second copy started: {}",
        second.stderr()
    );
    assert!(first.process.try_wait().is_none(), "the first still drains");
    receiver.release();
    assert_eq!(first.process.exited().await.code(), Some(0));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_missing_grant() {
    let db = TestDb::create().await.unwrap();
    let ns = db.namespace();
    // A user with operations.md's SELECTs but without UPDATE on the request table.
    let user = format!("{ns}_ro");
    common::admin_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")).await;
    for table in ["herald_webhookrequest", "herald_webhook"] {
        common::admin_sql(&format!(
            "GRANT SELECT ON `{ns}_herald`.`{table}` TO '{user}'@'%'"
        ))
        .await;
    }
    let service = Service::start(
        ns,
        &[
            ("GORGE_WEBHOOK_MYSQL_USER", user.as_str()),
            ("GORGE_WEBHOOK_MYSQL_PASS", "pw"),
        ],
    );
    let expected = format!(
        r#"{{"status":"unavailable","reason":"missing privilege, nothing can be claimed: GRANT UPDATE ON `{ns}_herald`.`herald_webhookrequest` TO '{user}'@'%' (docs/operations.md, \"Database grants\")"}}"#
    );
    eventually(
        Duration::from_secs(20),
        "readyz names the grant",
        || async { service.get("/readyz", &[]) == (503, expected.clone()) },
    )
    .await;

    // The operator runs it; readiness follows without a restart.
    common::admin_sql(&format!(
        "GRANT UPDATE ON `{ns}_herald`.`herald_webhookrequest` TO '{user}'@'%'"
    ))
    .await;
    eventually(Duration::from_secs(20), "ready", || async {
        service.get("/readyz", &[]).0 == 200
    })
    .await;
    drop(service);
    common::admin_sql(&format!("DROP USER '{user}'@'%'")).await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_gives_the_storage_upgrade_hint_for_a_missing_table() {
    let db = TestDb::create().await.unwrap();
    let ns = db.namespace();
    common::admin_sql(&format!("DROP TABLE `{ns}_herald`.`herald_webhookrequest`")).await;
    let service = Service::start(ns, &[]);
    let expected = format!(
        r#"{{"status":"unavailable","reason":"database error: Table '{ns}_herald.herald_webhookrequest' doesn't exist (has Phorge's `bin/storage upgrade` run?)"}}"#
    );
    eventually(Duration::from_secs(20), "readyz gives the hint", || async {
        service.get("/readyz", &[]) == (503, expected.clone())
    })
    .await;
    drop(service);
    db.drop_database().await;
}

/// `info,delivery=debug` logs every POST; a failure written back names the host it went to
/// (never the URI: it may carry credentials).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_names_its_host_and_delivery_at_debug_logs_the_post() {
    let db = TestDb::create().await.unwrap();
    let receiver = Receiver::start(500);
    let hook = enabled_hook(&db, &receiver.url("/secret-path?token=abc")).await;
    db.insert_request(&NewRequest::new(&hook, "PHID-TASK-host"), unix_now())
        .await
        .unwrap();
    let service = Service::start(
        db.namespace(),
        &[("GORGE_LOG_LEVEL", "info,delivery=debug")],
    );
    let failed = service.process.logged("WEBHOOK_DELIVERY_FAILED").await;
    assert_eq!(failed["host"], "127.0.0.1", "{failed}");
    assert_eq!(failed["reason"], "5xx", "{failed}");
    let posted = service.process.logged("WEBHOOK_POSTED").await;
    assert_eq!(posted["component"], "delivery", "{posted}");
    assert_eq!(posted["result"], "500", "{posted}");
    assert_eq!(posted["host"], "127.0.0.1", "{posted}");
    assert!(!service.process.lines().join("\n").contains("secret-path"));
    // Other components stay at info.
    assert!(service.process.log_events("WEBHOOK_POLLED").is_empty());
    drop(service);
    db.drop_database().await;
}

/// An account made as Phorge's docs make them, `'user'@'localhost'`, matches only socket
/// connections: `/readyz` says so, and how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_over_tcp_explains_localhost_accounts() {
    let db = TestDb::create().await.unwrap();
    let user = format!("{}_lh", db.namespace());
    common::admin_sql(&format!(
        "CREATE USER '{user}'@'localhost' IDENTIFIED BY 'pw'"
    ))
    .await;
    let service = Service::start(
        db.namespace(),
        &[
            ("GORGE_WEBHOOK_MYSQL_USER", user.as_str()),
            ("GORGE_WEBHOOK_MYSQL_PASS", "pw"),
        ],
    );
    let (status, body) = service.get("/readyz", &[]);
    common::admin_sql(&format!("DROP USER '{user}'@'localhost'")).await;
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reason = body["reason"].as_str().unwrap();
    let opts = gorge_claim::testdb::server_opts();
    let fix = format!(
        " (connecting to {}:{} as '{user}' (GORGE_WEBHOOK_MYSQL_HOST, GORGE_WEBHOOK_MYSQL_PORT)): \
         check GORGE_WEBHOOK_MYSQL_USER and GORGE_WEBHOOK_MYSQL_PASS — the password is wrong, or \
         no account '{user}' matches the address the server names above. An account made as \
         '{user}'@'localhost' matches only socket connections unless the server resolves this \
         client to localhost: create '{user}'@'<that address>' with the same password and \
         grants, or set GORGE_WEBHOOK_MYSQL_SOCKET to the server's socket \
         (e.g. /run/mysqld/mysqld.sock)",
        opts.ip_or_hostname(),
        opts.tcp_port()
    );
    assert!(
        reason.contains(&format!("Access denied for user '{user}'@'")) && reason.ends_with(&fix),
        "{reason}"
    );
    drop(service);
    db.drop_database().await;
}

/// `/api/webhook/queue`: which hooks have queued rows, the oldest first, and whose breaker
/// is open — counts and PHIDs only, never a URI or a key (the port may be unauthenticated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_per_hook_shows_counts_phids_and_open_breakers() {
    let db = TestDb::create().await.unwrap();
    let now = unix_now();
    // Hook A: two rows Phorge kept for itself (not handed over), so they stay queued.
    let a = enabled_hook(&db, "http://127.0.0.1:9/a-secret-path").await;
    let oldest_a = NewRequest::new(&a, "PHID-TASK-a1").not_handed_over();
    db.insert_request(&oldest_a, now - 100).await.unwrap();
    db.insert_request(
        &NewRequest::new(&a, "PHID-TASK-a2").not_handed_over(),
        now - 50,
    )
    .await
    .unwrap();
    // Hook B: ten failures in the window (the default threshold), then one queued row its
    // open breaker holds back.
    let b = db.tagged_hook_phid("b");
    db.insert_hook(
        &b,
        "http://127.0.0.1:9/b-secret-path",
        HookStatus::Enabled,
        "key-b",
    )
    .await
    .unwrap();
    for i in 0..10 {
        let failed = NewRequest::new(&b, &format!("PHID-TASK-b{i}")).attempted(
            RequestStatus::Failed,
            RequestResult::Fail,
            now,
        );
        db.insert_request(&failed, now - 20).await.unwrap();
    }
    let held = NewRequest::new(&b, "PHID-TASK-bq");
    db.insert_request(&held, now - 10).await.unwrap();

    let service = Service::start(db.namespace(), &[("GORGE_SERVICE_TOKEN", "t0k")]);
    assert_eq!(service.get("/api/webhook/queue", &[]).0, 401);
    let (status, body) = service.get("/api/webhook/queue", &[("X-Service-Token", "t0k")]);
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("secret-path") && !body.contains("key-b") && !body.contains("127.0.0.1"),
        "{body}"
    );
    let mut data: serde_json::Value = serde_json::from_str(&body).unwrap();
    let data = data["data"].take();
    let hooks = data["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2, "{body}");
    // Ages are read against the service's clock: only bounded from below and above.
    let age_a = hooks[0]["oldestAgeSec"].as_u64().unwrap();
    assert!((100..100 + 60).contains(&age_a), "{body}");
    assert_eq!(
        hooks[0],
        serde_json::json!({"hookPHID": a, "queued": 2, "oldestAgeSec": age_a,
            "oldestRequestPHID": oldest_a.phid, "recentFailures": 0, "breakerOpen": false})
    );
    let age_b = hooks[1]["oldestAgeSec"].as_u64().unwrap();
    assert_eq!(
        hooks[1],
        serde_json::json!({"hookPHID": b, "queued": 1, "oldestAgeSec": age_b,
            "oldestRequestPHID": held.phid, "recentFailures": 10, "breakerOpen": true})
    );
    assert_eq!(
        (
            &data["truncated"],
            &data["errorBackoffSec"],
            &data["errorThreshold"]
        ),
        (
            &serde_json::json!(false),
            &serde_json::json!(300),
            &serde_json::json!(10)
        )
    );
    drop(service);
    db.drop_database().await;
}

/// `/api/webhook/queue` costs the database hundreds of ms at a large backlog: calls at the
/// same time share one run of its queries, and calls within 5 s reuse its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_queue_calls_make_one_query() {
    const CALLS: usize = 20;
    let db = TestDb::create().await.unwrap();
    let hook = enabled_hook(&db, "http://127.0.0.1:9/hook").await;
    let row = NewRequest::new(&hook, "PHID-TASK-q1").not_handed_over();
    db.insert_request(&row, unix_now()).await.unwrap();
    let service = Service::start(db.namespace(), &[("GORGE_SERVICE_TOKEN", "t0k")]);
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..CALLS)
            .map(|_| {
                scope.spawn(|| service.get("/api/webhook/queue", &[("X-Service-Token", "t0k")]))
            })
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    });
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body, &answers[0].1, "one answer shared");
    }
    assert!(answers[0].1.contains(&hook), "{}", answers[0].1);
    let count = |source: &str| {
        service.metric(&format!(
            "gorge_webhook_queue_answers_total{{source=\"{source}\"}}"
        ))
    };
    assert_eq!(
        (count("queried"), count("reused")),
        (1.0, (CALLS - 1) as f64)
    );
    drop(service);
    db.drop_database().await;
}

/// A wrong password: the reason names the two settings to check, not only the account the
/// server saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_names_the_user_and_password_settings() {
    let db = TestDb::create().await.unwrap();
    let user = format!("{}_pw", db.namespace());
    common::admin_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'right'")).await;
    let service = Service::start(
        db.namespace(),
        &[
            ("GORGE_WEBHOOK_MYSQL_USER", user.as_str()),
            ("GORGE_WEBHOOK_MYSQL_PASS", "wrong"),
        ],
    );
    let (status, body) = service.get("/readyz", &[]);
    common::admin_sql(&format!("DROP USER '{user}'@'%'")).await;
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("Access denied for user '{user}'@'"))
            && reason.contains("check GORGE_WEBHOOK_MYSQL_USER and GORGE_WEBHOOK_MYSQL_PASS"),
        "{reason}"
    );
    drop(service);
    db.drop_database().await;
}

/// A user without UPDATE: the GRANT to run is logged when the database is ready; the claims
/// the server refuses are not logged in its raw words row by row but as that GRANT, at most
/// once per 10 s; a row whose URI is blocked is logged once, not at every poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_update_is_told_the_grant_once() {
    let db = TestDb::create().await.unwrap();
    let user = format!("{}_ro", db.namespace());
    common::admin_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")).await;
    common::admin_sql(&format!(
        "GRANT SELECT ON `{}`.* TO '{user}'@'%'",
        db.database()
    ))
    .await;
    let receiver = Receiver::start(200);
    let hook = enabled_hook(&db, &receiver.url("/hook")).await;
    let blocked = db.tagged_hook_phid("blocked");
    db.insert_hook(&blocked, "http://192.0.2.1/x", HookStatus::Enabled, "k")
        .await
        .unwrap();
    for hook in [&hook, &blocked] {
        let row = NewRequest::new(hook, "PHID-GRGX-nogrant000000000");
        db.insert_request(&row, unix_now()).await.unwrap();
    }
    let service = Service::start(
        db.namespace(),
        &[
            ("GORGE_WEBHOOK_MYSQL_USER", user.as_str()),
            ("GORGE_WEBHOOK_MYSQL_PASS", "pw"),
            ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "192.0.2.0/24"),
        ],
    );
    service.wait_polls(10).await;
    common::admin_sql(&format!("DROP USER '{user}'@'%'")).await;
    let grant = format!(
        "GRANT UPDATE ON `{}`.`herald_webhookrequest` TO '{user}'@'%'",
        db.database()
    );
    let lines = service.process.log_events("WEBHOOK_GRANT_MISSING");
    let said: Vec<(&str, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["grant"].as_str().unwrap(),
                l["failures"].as_u64().unwrap(),
            )
        })
        .collect();
    // At readiness, then the first refused claim (the next within 10 s are only counted).
    assert_eq!(
        said,
        [(grant.as_str(), 0), (grant.as_str(), 1)],
        "{lines:?}"
    );
    assert_eq!(
        service.process.log_events("WEBHOOK_ROW_DB_ERROR"),
        Vec::<serde_json::Value>::new()
    );
    assert_eq!(
        service.process.log_events("WEBHOOK_POLICY_BLOCKED").len(),
        1,
        "{:?}",
        service.process.log_events("WEBHOOK_POLICY_BLOCKED")
    );
    assert_eq!(receiver.count(), 0);
    drop(service);
    db.drop_database().await;
}
