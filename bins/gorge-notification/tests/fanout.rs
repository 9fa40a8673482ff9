//! The fan-out's batched passes: messages that arrive while a pass runs share the next one
//! (each socket gets them in one write). That may not reorder, lose or repeat a frame on
//! any socket.

mod common;

use common::{InProcess, Ws};
use futures_util::future::join_all;
use serde_json::Value;

/// Enough sockets that one pass over them takes long enough for POSTs to queue behind it.
const SOCKETS: usize = 1100;

const MESSAGES: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sockets_get_a_fast_burst_in_order_exactly_once() {
    let _ = gorge_service::fdlimit::raise_to_hard();
    let server = InProcess::start(|_| {}).await;
    let port = server.client_port;
    let mut sockets = join_all((0..SOCKETS).map(|_| async move {
        let mut ws = Ws::connect(port, "/").await;
        ws.subscribe(&["PHID-TEST-fanout"]).await;
        ws
    }))
    .await;
    // PHP's POSTs are answered on acceptance, so these queue up behind the first pass.
    for key in 1..=MESSAGES {
        let body =
            format!(r#"{{"key":{key},"type":"notification","subscribers":["PHID-TEST-fanout"]}}"#);
        assert_eq!(server.post("", &body).await.status, 200);
    }
    for ws in &mut sockets {
        let mut keys = Vec::with_capacity(MESSAGES);
        for _ in 0..MESSAGES {
            let frame: Value = serde_json::from_str(&ws.next_text().await).unwrap();
            keys.push(frame["key"].as_u64().unwrap() as usize);
        }
        assert_eq!(keys, (1..=MESSAGES).collect::<Vec<_>>());
        assert_eq!(
            ws.sync().await,
            Vec::<String>::new(),
            "nothing more arrives"
        );
    }
    let status = server.status("").await;
    assert_eq!(status["messages.out"], (SOCKETS * MESSAGES) as u64);
    let batched = server
        .metric("gorge_notification_fanout_batch_messages_sum")
        .await
        .unwrap();
    assert_eq!(
        batched, MESSAGES as f64,
        "every message in exactly one pass"
    );
}
