//! Test support (feature `test-support`): a throwaway `{random}_herald` database built from
//! `compat/herald-schema.sql`, filled the way Phorge fills it.
//!
//! Each [`TestDb`] gets its own namespace (`gt<hex>`, or one chosen up front with
//! [`unique_namespace`] and [`TestDb::create_in`]), so tests run in parallel without seeing
//! each other. Named MySQL locks are server-wide, not per database: hooks must be named with
//! [`TestDb::hook_phid`] / [`TestDb::tagged_hook_phid`] so that the lock names of test files
//! running at the same time differ too. The server comes from `GORGE_TEST_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306`). Call [`TestDb::drop_database`] at the end; if a test
//! panics first, `Drop` removes the database on a helper thread.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gorge_claim::ClaimError> {
//! use gorge_claim::testdb::{HookStatus, NewRequest, RequestStatus, TestDb};
//! let db = TestDb::create().await?;
//! let hook = db.hook_phid();
//! db.insert_hook(&hook, "http://127.0.0.1:9/", HookStatus::Enabled, "key").await?;
//! let id = db.insert_request(&NewRequest::new(&hook, "PHID-TASK-x"), 1_700_000_000).await?;
//! let store = db.store();
//! let row = db.read_request(id).await?;
//! assert_eq!(row.status, RequestStatus::Queued);
//! db.drop_database().await;
//! # Ok(()) }
//! ```

use std::sync::Mutex;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool};

pub use phorge_wire::values::{HookStatus, RequestResult, RequestStatus};

use crate::error::ClaimError;
pub use crate::handover::with_marker;
use crate::objects::{object_kind, ObjectKind};
use crate::store::ClaimStore;

const SCHEMA: &str = include_str!("../../../compat/herald-schema.sql");

/// Phorge's Maniphest task and transaction tables (see [`TestDb::create_maniphest`]).
const MANIPHEST_SCHEMA: &str = include_str!("../../../compat/maniphest-schema.sql");

/// Runs the statements of a `compat/*-schema.sql` file for `namespace`.
async fn run_schema(conn: &mut Conn, sql: &str, namespace: &str) -> mysql_async::Result<()> {
    let schema = sql.replace("{$NAMESPACE}", namespace);
    let without_comments: String = schema
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in without_comments.split(';').map(str::trim) {
        if !statement.is_empty() {
            conn.query_drop(statement).await?;
        }
    }
    Ok(())
}

/// Default server for database tests.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306";

/// `GORGE_TEST_MYSQL_URL`, or [`DEFAULT_MYSQL_URL`] when unset or empty.
pub fn mysql_url() -> String {
    std::env::var("GORGE_TEST_MYSQL_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| DEFAULT_MYSQL_URL.to_owned())
}

/// Server options from [`mysql_url`], with no database selected. Panics on a bad URL
/// (a broken test environment, not a test result).
pub fn server_opts() -> Opts {
    Opts::from_url(&mysql_url()).expect("GORGE_TEST_MYSQL_URL is not a valid mysql:// URL")
}

/// A row to insert as a switched Phorge's `HeraldWebhookRequest::save()` and `queueCall()`
/// would: handed over (the marker of [`crate::handover`] in `properties`) unless
/// [`NewRequest::not_handed_over`] says it is Phorge's own.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// Defaults to a fresh random `PHID-HWBR-…`.
    pub phid: String,
    pub webhook_phid: String,
    pub object_phid: String,
    /// Defaults to what a Herald rule writes (`retry` forever, one transaction, one trigger).
    pub properties: String,
    /// Defaults to a new row: `queued`, result `none`, epoch 0.
    pub status: RequestStatus,
    pub last_request_result: RequestResult,
    pub last_request_epoch: u64,
    /// Defaults to true: `properties` is stored with the hand-over marker as its first key
    /// (text that is not a JSON object is stored as given).
    pub handed_over: bool,
}

impl NewRequest {
    /// A request of `webhook_phid` about `object_phid` with default properties.
    pub fn new(webhook_phid: &str, object_phid: &str) -> Self {
        NewRequest {
            phid: format!("PHID-HWBR-{}", random_hex(20)),
            webhook_phid: webhook_phid.to_owned(),
            object_phid: object_phid.to_owned(),
            properties: r#"{"retry":"forever","transactionPHIDs":["PHID-XACT-TASK-aaaaaaaaaaaaaaa"],"triggerPHIDs":["PHID-HRUL-aaaaaaaaaaaaaaaaaaaa"],"silent":false,"secure":false,"test":false}"#.to_owned(),
            status: RequestStatus::Queued,
            last_request_result: RequestResult::None,
            last_request_epoch: 0,
            handed_over: true,
        }
    }

    /// A row Phorge did not hand over (a stock or un-switched Phorge's): stored without the
    /// marker, so the service must never touch it.
    pub fn not_handed_over(mut self) -> Self {
        self.handed_over = false;
        self
    }

    /// `properties` as stored.
    pub fn stored_properties(&self) -> String {
        if self.handed_over {
            with_marker(&self.properties)
        } else {
            self.properties.clone()
        }
    }

    /// Replaces the random request PHID.
    pub fn with_phid(mut self, phid: &str) -> Self {
        self.phid = phid.to_owned();
        self
    }

    /// A row that was already attempted: `status`, `lastRequestResult` and
    /// `lastRequestEpoch` as stored after that attempt.
    pub fn attempted(mut self, status: RequestStatus, result: RequestResult, epoch: u64) -> Self {
        self.status = status;
        self.last_request_result = result;
        self.last_request_epoch = epoch;
        self
    }

    /// Replaces the properties JSON text (stored with the marker unless `not_handed_over`).
    pub fn with_properties(mut self, properties: &str) -> Self {
        self.properties = properties.to_owned();
        self
    }
}

/// A `herald_webhookrequest` row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRow {
    pub id: u64,
    pub phid: String,
    pub webhook_phid: String,
    pub object_phid: String,
    pub status: RequestStatus,
    pub properties: String,
    pub last_request_result: RequestResult,
    pub last_request_epoch: u64,
    pub date_created: u64,
    pub date_modified: u64,
}

/// A freshly created `{namespace}_herald` database; removed by
/// [`TestDb::drop_database`] (or, as a fallback, on drop).
pub struct TestDb {
    namespace: String,
    database: String,
    pool: Pool,
    dropped: bool,
    /// Application databases (`{namespace}_maniphest`, …) created for object and
    /// transaction rows; dropped with this one.
    extra: Mutex<Vec<String>>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

fn random_hex(len: usize) -> String {
    (0..len)
        .map(|_| char::from_digit(rand::random_range(0..16u32), 16).unwrap_or('0'))
        .collect()
}

/// A namespace no other test uses (`gt<random hex>`), for a test that must know it before
/// its database exists (e.g. a service started first); create it with [`TestDb::create_in`].
pub fn unique_namespace() -> String {
    format!("gt{}", random_hex(12))
}

/// The head of an INSERT of [`NewRequest`] rows; each row is [`REQUEST_VALUES`] bound to
/// [`request_params`].
const INSERT_REQUEST: &str = "INSERT INTO herald_webhookrequest \
     (phid, webhookPHID, objectPHID, status, properties, lastRequestResult, \
      lastRequestEpoch, dateCreated, dateModified) VALUES";

const REQUEST_VALUES: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?)";

fn request_params(r: &NewRequest, now: u64) -> [mysql_async::Value; 9] {
    [
        r.phid.as_str().into(),
        r.webhook_phid.as_str().into(),
        r.object_phid.as_str().into(),
        r.status.as_str().into(),
        r.stored_properties().into(),
        r.last_request_result.as_str().into(),
        r.last_request_epoch.into(),
        now.into(),
        now.into(),
    ]
}

impl TestDb {
    /// Creates `gt<random>_herald` with Phorge's tables on the test server.
    pub async fn create() -> Result<TestDb, ClaimError> {
        TestDb::create_in(&unique_namespace()).await
    }

    /// Creates `{namespace}_herald` with Phorge's tables; `namespace` should come from
    /// [`unique_namespace`].
    pub async fn create_in(namespace: &str) -> Result<TestDb, ClaimError> {
        let namespace = namespace.to_owned();
        let database = format!("{namespace}_herald");
        let map = |e| ClaimError::from_driver(e, &database);
        let mut admin = Conn::new(server_opts()).await.map_err(map)?;
        run_schema(&mut admin, SCHEMA, &namespace)
            .await
            .map_err(map)?;
        let _ = admin.disconnect().await;
        let pool = Pool::new(OptsBuilder::from_opts(server_opts()).db_name(Some(&database)));
        Ok(TestDb {
            namespace,
            database,
            pool,
            dropped: false,
            extra: Mutex::new(Vec::new()),
        })
    }

    /// The storage namespace (`gt<hex>`), for services configured by namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A hook PHID of this namespace (`PHID-HWBH-<namespace>`): its lock name belongs to
    /// this test alone.
    pub fn hook_phid(&self) -> String {
        format!("PHID-HWBH-{}", self.namespace)
    }

    /// Another hook PHID of this namespace (`PHID-HWBH-<namespace>-<tag>`).
    pub fn tagged_hook_phid(&self, tag: impl std::fmt::Display) -> String {
        format!("PHID-HWBH-{}-{tag}", self.namespace)
    }

    /// The database name (`<namespace>_herald`).
    pub fn database(&self) -> &str {
        &self.database
    }

    /// A new [`ClaimStore`] on this database (its own pool).
    pub fn store(&self) -> ClaimStore {
        ClaimStore::new(server_opts(), &self.database)
    }

    /// A connection with this database selected, for ad-hoc SQL in tests.
    pub async fn conn(&self) -> Result<Conn, ClaimError> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| ClaimError::from_driver(e, &self.database))
    }

    /// Inserts a hook as Phorge's `HeraldWebhook::save()` would (policies `users`).
    pub async fn insert_hook(
        &self,
        phid: &str,
        uri: &str,
        status: HookStatus,
        hmac_key: &str,
    ) -> Result<(), ClaimError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(
            "INSERT INTO herald_webhook \
             (phid, name, webhookURI, viewPolicy, editPolicy, status, hmacKey, dateCreated, dateModified) \
             VALUES (?, ?, ?, 'users', 'users', ?, ?, 0, 0)",
            (phid, format!("hook {phid}"), uri, status.as_str(), hmac_key),
        )
        .await
        .map_err(|e| ClaimError::from_driver(e, &self.database))
    }

    /// Inserts a request as Lisk does: `dateCreated = dateModified = now` (a new row is
    /// `queued` with result `none` and epoch 0, see [`NewRequest`]). Returns the row id.
    pub async fn insert_request(&self, request: &NewRequest, now: u64) -> Result<u64, ClaimError> {
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("{INSERT_REQUEST} {REQUEST_VALUES}"),
            request_params(request, now).to_vec(),
        )
        .await
        .map_err(|e| ClaimError::from_driver(e, &self.database))?;
        Ok(conn.last_insert_id().unwrap_or(0))
    }

    /// [`TestDb::insert_request`] for many rows at once (one multi-row statement per
    /// thousand rows, for backlogs of thousands).
    pub async fn insert_requests(
        &self,
        requests: &[NewRequest],
        now: u64,
    ) -> Result<(), ClaimError> {
        let mut conn = self.conn().await?;
        for chunk in requests.chunks(1000) {
            let placeholders = vec![REQUEST_VALUES; chunk.len()].join(", ");
            let params: Vec<mysql_async::Value> =
                chunk.iter().flat_map(|r| request_params(r, now)).collect();
            conn.exec_drop(format!("{INSERT_REQUEST} {placeholders}"), params)
                .await
                .map_err(|e| ClaimError::from_driver(e, &self.database))?;
        }
        Ok(())
    }

    /// How many requests have `status` now.
    pub async fn count_requests(&self, status: RequestStatus) -> Result<u64, ClaimError> {
        let mut conn = self.conn().await?;
        let count: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM herald_webhookrequest WHERE status = ?",
                (status.as_str(),),
            )
            .await
            .map_err(|e| ClaimError::from_driver(e, &self.database))?;
        Ok(count.unwrap_or(0))
    }

    /// Creates `{namespace}_<database>`.`table` with the columns the service reads from
    /// Phorge's object and transaction tables (`id`, `phid`, `objectPHID`), unless it exists
    /// (e.g. `herald_webhook`). Returns the qualified name.
    pub async fn create_app_table(
        &self,
        database: &str,
        table: &str,
    ) -> Result<String, ClaimError> {
        let full_db = format!("{}_{database}", self.namespace);
        let map = |e| ClaimError::from_driver(e, &full_db);
        let mut conn = self.conn().await?;
        if full_db != self.database {
            let mut extra = self.extra.lock().unwrap_or_else(|e| e.into_inner());
            if !extra.contains(&full_db) {
                extra.push(full_db.clone());
            }
        }
        conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{full_db}`"))
            .await
            .map_err(map)?;
        let qualified = format!("`{full_db}`.`{table}`");
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {qualified} (\
             id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             phid VARBINARY(64) NOT NULL, \
             objectPHID VARBINARY(64) NOT NULL DEFAULT '', \
             UNIQUE KEY key_phid (phid))"
        ))
        .await
        .map_err(map)?;
        Ok(qualified)
    }

    /// Creates `{namespace}_maniphest` with Phorge's own task and transaction tables
    /// (`compat/maniphest-schema.sql`); dropped with the database.
    pub async fn create_maniphest(&self) -> Result<(), ClaimError> {
        let database = format!("{}_maniphest", self.namespace);
        let mut conn = self.conn().await?;
        run_schema(&mut conn, MANIPHEST_SCHEMA, &self.namespace)
            .await
            .map_err(|e| ClaimError::from_driver(e, &database))?;
        let mut extra = self.extra.lock().unwrap_or_else(|e| e.into_inner());
        if !extra.contains(&database) {
            extra.push(database);
        }
        Ok(())
    }

    /// Inserts tasks into the tables of [`TestDb::create_maniphest`], each with its
    /// transactions (ids ascending in the order given), as Phorge's editor saves them; one
    /// statement per table.
    pub async fn insert_tasks(&self, tasks: &[(String, Vec<String>)]) -> Result<(), ClaimError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let database = format!("{}_maniphest", self.namespace);
        let map = |e| ClaimError::from_driver(e, &database);
        let mut conn = self.conn().await?;
        let task_rows = vec![
            "(?, 'PHID-USER-bench', 'open', 50, 'bench task', '', 0, 0, \
             'aaaaaaaaaaaaaaaaaaaa', 0, 'users', 'users', '{}', 'default')";
            tasks.len()
        ];
        let params: Vec<mysql_async::Value> =
            tasks.iter().map(|(phid, _)| phid.as_str().into()).collect();
        conn.exec_drop(
            format!(
                "INSERT INTO `{database}`.maniphest_task (phid, authorPHID, status, priority, \
                 title, description, dateCreated, dateModified, mailKey, subpriority, \
                 viewPolicy, editPolicy, properties, subtype) VALUES {}",
                task_rows.join(", ")
            ),
            params,
        )
        .await
        .map_err(map)?;
        let xactions: Vec<(&str, &str)> = tasks
            .iter()
            .flat_map(|(task, xactions)| xactions.iter().map(move |x| (x.as_str(), task.as_str())))
            .collect();
        if xactions.is_empty() {
            return Ok(());
        }
        let rows = vec![
            "(?, 'PHID-USER-bench', ?, 'users', 'users', 0, 'core:comment', \
             'null', 'null', '{}', '{}', 0, 0)";
            xactions.len()
        ];
        let params: Vec<mysql_async::Value> = xactions
            .iter()
            .flat_map(|(phid, task)| [(*phid).into(), (*task).into()])
            .collect();
        conn.exec_drop(
            format!(
                "INSERT INTO `{database}`.maniphest_transaction (phid, authorPHID, objectPHID, \
                 viewPolicy, editPolicy, commentVersion, transactionType, oldValue, newValue, \
                 contentSource, metadata, dateCreated, dateModified) VALUES {}",
                rows.join(", ")
            ),
            params,
        )
        .await
        .map_err(map)
    }

    /// Makes the object `phid` exist in its application's table (see `objects`). Objects
    /// stored in `herald_webhook` (hooks) must be inserted with [`TestDb::insert_hook`].
    pub async fn insert_object(&self, phid: &str) -> Result<(), ClaimError> {
        let ObjectKind::Stored(tables) = object_kind(phid) else {
            panic!("{phid}: not a PHID type with an object table");
        };
        if tables.object_table == "herald_webhook" {
            return Ok(());
        }
        let table = self
            .create_app_table(tables.database, tables.object_table)
            .await?;
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("INSERT IGNORE INTO {table} (phid) VALUES (?)"),
            (phid,),
        )
        .await
        .map_err(|e| ClaimError::from_driver(e, &self.database))
    }

    /// Inserts transaction `phid` (`PHID-XACT-<TYPE>-…`) of `object_phid` with row `id` into
    /// the transaction table of `<TYPE>`, as Phorge's editor would.
    pub async fn insert_transaction(
        &self,
        id: u64,
        phid: &str,
        object_phid: &str,
    ) -> Result<(), ClaimError> {
        let kind = phid.split('-').nth(2).unwrap_or("????");
        let ObjectKind::Stored(tables) = object_kind(&format!("PHID-{kind}-x")) else {
            panic!("{phid}: no transaction table for type {kind}");
        };
        let (database, table) = tables
            .transactions
            .unwrap_or_else(|| panic!("{phid}: type {kind} has no transactions"));
        let table = self.create_app_table(database, table).await?;
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("INSERT IGNORE INTO {table} (id, phid, objectPHID) VALUES (?, ?, ?)"),
            (id, phid, object_phid),
        )
        .await
        .map_err(|e| ClaimError::from_driver(e, &self.database))
    }

    /// Reads a request row back; panics if it does not exist (tests only look up ids they
    /// inserted).
    pub async fn read_request(&self, id: u64) -> Result<RequestRow, ClaimError> {
        type Row = (
            u64,
            String,
            String,
            String,
            String,
            String,
            String,
            u64,
            u64,
            u64,
        );
        let mut conn = self.conn().await?;
        let row: Option<Row> = conn
            .exec_first(
                "SELECT id, phid, webhookPHID, objectPHID, status, properties, lastRequestResult, \
                 lastRequestEpoch, dateCreated, dateModified FROM herald_webhookrequest WHERE id = ?",
                (id,),
            )
            .await
            .map_err(|e| ClaimError::from_driver(e, &self.database))?;
        let (
            id,
            phid,
            webhook_phid,
            object_phid,
            status,
            properties,
            last_request_result,
            last_request_epoch,
            date_created,
            date_modified,
        ) = row.unwrap_or_else(|| panic!("no herald_webhookrequest row with id {id}"));
        Ok(RequestRow {
            id,
            phid,
            webhook_phid,
            object_phid,
            status: RequestStatus::parse(&status)
                .unwrap_or_else(|| panic!("row {id}: status {status:?} is not Phorge's")),
            properties,
            last_request_result: RequestResult::parse(&last_request_result).unwrap_or_else(|| {
                panic!("row {id}: lastRequestResult {last_request_result:?} is not Phorge's")
            }),
            last_request_epoch,
            date_created,
            date_modified,
        })
    }

    fn all_databases(&self) -> Vec<String> {
        let mut all = self.extra.lock().unwrap_or_else(|e| e.into_inner()).clone();
        all.push(self.database.clone());
        all
    }

    /// Drops the database (and the application databases it created) and closes the pool.
    pub async fn drop_database(mut self) {
        self.dropped = true;
        if let Ok(mut conn) = self.pool.get_conn().await {
            for database in self.all_databases() {
                let _ = conn
                    .query_drop(format!("DROP DATABASE IF EXISTS `{database}`"))
                    .await;
            }
        }
        let _ = self.pool.clone().disconnect().await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // A test failed before cleanup: drop the database on a private runtime so this works
        // from inside or outside an async context.
        let databases = self.all_databases();
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut conn) = Conn::new(server_opts()).await {
                    for database in databases {
                        let _ = conn
                            .query_drop(format!("DROP DATABASE IF EXISTS `{database}`"))
                            .await;
                    }
                    let _ = conn.disconnect().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
