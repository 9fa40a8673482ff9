//! A throwaway `{namespace}_herald` database for one run (gorge-claim's test support builds
//! it from Phorge's real schema), seeded in bulk the way Phorge inserts hooks and requests,
//! read back for verdicts, dropped after.

use gorge_claim::testdb::{self, HookStatus, NewRequest, RequestStatus, TestDb};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde_json::Value;

/// Rows per seeding step (each one multi-row INSERT): `after_chunk` of
/// [`HeraldDb::insert_requests`] runs this often.
const INSERT_CHUNK: usize = 1000;

/// Host and port of the MariaDB server the bench uses (`GORGE_TEST_MYSQL_URL`, as the
/// tests do), for the services' environment.
pub fn mysql_host_port() -> (String, u16) {
    let opts = testdb::server_opts();
    (opts.ip_or_hostname().to_string(), opts.tcp_port())
}

/// Transactions per task: a Herald rule's request lists the transactions of one edit.
const TRANSACTIONS_PER_TASK: usize = 3;

/// The task of row `seq`; it exists in `{namespace}_maniphest`.
fn task_phid(seq: usize) -> String {
    format!("PHID-TASK-bench{seq:010}")
}

/// The transactions of row `seq`'s task, oldest first (the order the editor queues them).
/// The first is [`transaction_phid`]; the others only add letters, so the row's number
/// still follows the marker in the body whichever comes first.
fn transaction_phids(seq: usize) -> Vec<String> {
    let first = transaction_phid(seq);
    (0..TRANSACTIONS_PER_TASK)
        .map(|i| match i {
            0 => first.clone(),
            _ => format!("{first}x{i}"),
        })
        .collect()
}

/// Row `spec` as Phorge's Herald rule would queue it.
fn new_request(spec: &RequestSpec) -> NewRequest {
    let properties = serde_json::json!({
        "retry": if spec.retry_forever { "forever" } else { "never" },
        "transactionPHIDs": transaction_phids(spec.seq),
        "triggerPHIDs": ["PHID-HRUL-bench0000000001"],
        "silent": false,
        "secure": false,
        "test": false,
    });
    NewRequest::new(&spec.hook_phid, &task_phid(spec.seq))
        .with_phid(&request_phid(spec.seq))
        .with_properties(&properties.to_string())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// One hook to seed.
pub struct HookSpec {
    pub phid: String,
    pub uri: String,
    pub hmac_key: String,
}

/// One queued request to seed; `seq` is also woven into its PHIDs so the receiver can tell
/// which row a POST belongs to.
pub struct RequestSpec {
    pub seq: usize,
    pub hook_phid: String,
    pub retry_forever: bool,
}

pub fn request_phid(seq: usize) -> String {
    format!("PHID-HWBR-bench{seq:010}")
}

/// The transaction PHID of row `seq`; it is what identifies the row inside the POST body.
pub fn transaction_phid(seq: usize) -> String {
    format!("PHID-XACT-TASK-bench{seq:010}")
}

pub const TRANSACTION_MARKER: &str = "PHID-XACT-TASK-bench";

/// One row as read back after a run.
#[derive(Debug, Clone)]
pub struct RowState {
    pub seq: usize,
    pub status: String,
    pub last_result: String,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
}

/// A fresh database from gorge-claim's test support (which also drops it if a run is cut
/// short), plus the bulk seeding and read-back the bench needs.
pub struct HeraldDb {
    db: TestDb,
    pub namespace: String,
    pub database: String,
}

impl HeraldDb {
    /// Creates a fresh `gt<random>_herald` database with Phorge's tables, and
    /// `gt<random>_maniphest` with Phorge's task and transaction tables.
    pub async fn create() -> Result<HeraldDb, String> {
        let db = TestDb::create()
            .await
            .map_err(|e| format!("create database: {e}"))?;
        db.create_maniphest()
            .await
            .map_err(|e| format!("create maniphest tables: {e}"))?;
        Ok(HeraldDb {
            namespace: db.namespace().to_string(),
            database: db.database().to_string(),
            db,
        })
    }

    async fn conn(&self) -> Result<Conn, String> {
        self.db.conn().await.map_err(|e| format!("mysql: {e}"))
    }

    pub async fn insert_hooks(&self, hooks: &[HookSpec]) -> Result<(), String> {
        for hook in hooks {
            self.db
                .insert_hook(&hook.phid, &hook.uri, HookStatus::Enabled, &hook.hmac_key)
                .await
                .map_err(|e| format!("insert hooks: {e}"))?;
        }
        Ok(())
    }

    /// Inserts rows as Lisk does (`dateCreated = dateModified = now`), in chunks, each
    /// after the task and transactions it names; `after_chunk` runs right after each chunk
    /// is committed.
    pub async fn insert_requests(
        &self,
        rows: &[RequestSpec],
        mut after_chunk: impl FnMut(&[RequestSpec]),
    ) -> Result<(), String> {
        for chunk in rows.chunks(INSERT_CHUNK) {
            let tasks: Vec<(String, Vec<String>)> = chunk
                .iter()
                .map(|spec| (task_phid(spec.seq), transaction_phids(spec.seq)))
                .collect();
            self.db
                .insert_tasks(&tasks)
                .await
                .map_err(|e| format!("insert tasks: {e}"))?;
            let requests: Vec<NewRequest> = chunk.iter().map(new_request).collect();
            self.db
                .insert_requests(&requests, unix_now())
                .await
                .map_err(|e| format!("insert requests: {e}"))?;
            after_chunk(chunk);
        }
        Ok(())
    }

    /// The server's statement counters (`SHOW GLOBAL STATUS`) that say what a run cost:
    /// `Questions` and the `Com_*` of the statements the service sends. Server-wide: other
    /// clients of the server count too.
    pub async fn statement_counters(&self) -> Result<Vec<(String, u64)>, String> {
        let mut conn = self.conn().await?;
        conn.query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select', \
             'Com_update', 'Com_do', 'Com_stmt_prepare', 'Com_stmt_execute', 'Com_stmt_close', \
             'Com_kill')",
        )
        .await
        .map_err(|e| format!("status: {e}"))
    }

    /// Rows still `queued`.
    pub async fn queued(&self) -> Result<u64, String> {
        self.db
            .count_requests(RequestStatus::Queued)
            .await
            .map_err(|e| format!("count: {e}"))
    }

    /// Every bench row as stored now. Retried a few times: after a MariaDB restart the
    /// pool still holds dead connections, and a verdict must not read "no rows" from that.
    pub async fn rows(&self) -> Result<Vec<RowState>, String> {
        let mut attempt = 0;
        loop {
            match self.rows_once().await {
                Ok(rows) => return Ok(rows),
                Err(e) if attempt >= 4 => return Err(e),
                Err(_) => attempt += 1,
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    async fn rows_once(&self) -> Result<Vec<RowState>, String> {
        let mut conn = self.conn().await?;
        let sql = format!(
            "SELECT phid, status, lastRequestResult, properties FROM `{}`.herald_webhookrequest ORDER BY id",
            self.database
        );
        let raw: Vec<(Vec<u8>, String, String, String)> =
            conn.query(sql).await.map_err(|e| format!("rows: {e}"))?;
        Ok(raw
            .into_iter()
            .filter_map(|(phid, status, last_result, properties)| {
                let seq = String::from_utf8_lossy(&phid)
                    .strip_prefix("PHID-HWBR-bench")?
                    .parse()
                    .ok()?;
                let props: Value = serde_json::from_str(&properties).unwrap_or(Value::Null);
                // `errorCode` is an integer for statuses and cURL numbers, a string otherwise.
                let text = |key: &str| match props.get(key) {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Number(n)) => Some(n.to_string()),
                    _ => None,
                };
                Some(RowState {
                    seq,
                    status,
                    last_result,
                    error_type: text("errorType"),
                    error_code: text("errorCode"),
                })
            })
            .collect())
    }

    /// Drops the database and closes the pool.
    pub async fn drop_database(self) {
        let database = self.database.clone();
        self.db.drop_database().await;
        // The pooled connection used above can be dead after a server restart (and that
        // error is swallowed), so make sure on a fresh connection.
        if let Ok(mut conn) = Conn::new(testdb::server_opts()).await {
            let _ = conn
                .query_drop(format!("DROP DATABASE IF EXISTS `{database}`"))
                .await;
            let _ = conn.disconnect().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn seeded_rows_read_back_queued_with_their_sequence_numbers() {
        let db = HeraldDb::create().await.unwrap();
        let hook = HookSpec {
            phid: db.db.hook_phid(),
            uri: "http://127.0.0.1:9/".into(),
            hmac_key: "k".into(),
        };
        db.insert_hooks(std::slice::from_ref(&hook)).await.unwrap();
        let rows: Vec<RequestSpec> = (0..3)
            .map(|seq| RequestSpec {
                seq,
                hook_phid: hook.phid.clone(),
                retry_forever: seq != 1,
            })
            .collect();
        let mut chunks = 0;
        db.insert_requests(&rows, |_| chunks += 1).await.unwrap();
        assert_eq!(chunks, 1);
        assert_eq!(db.queued().await.unwrap(), 3);
        // Each row names a task that exists and its transactions, as Phorge queues them.
        let store = gorge_claim::ClaimStore::new(testdb::server_opts(), &db.database);
        let stored = transaction_phids(2);
        let mut newest_first = stored.clone();
        newest_first.reverse();
        assert_eq!(
            store.load_object(&task_phid(2), &stored).await.unwrap(),
            gorge_claim::ObjectLoad::Found {
                transactions: newest_first,
                unchecked: None
            }
        );
        let stored = db.rows().await.unwrap();
        let seen: Vec<(usize, &str, &str)> = stored
            .iter()
            .map(|r| (r.seq, r.status.as_str(), r.last_result.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (0, "queued", "none"),
                (1, "queued", "none"),
                (2, "queued", "none")
            ]
        );
        db.drop_database().await;
    }

    #[test]
    fn row_identity_round_trips() {
        assert_eq!(request_phid(42), "PHID-HWBR-bench0000000042");
        assert!(transaction_phid(42).starts_with(TRANSACTION_MARKER));
    }
}
