//! Loading requests' objects and transactions as Phorge's worker does, for a whole poll
//! round at once: one query per object table and one per transaction table, whatever the
//! number of requests (see `objects.rs` for where each PHID type is stored).
//!
//! Phorge's worker loads the object by PHID (missing → `ERROR_OBJECT`) and then the stored
//! transaction PHIDs that exist for that object, newest first (`ORDER BY id DESC`). Here the
//! same rows are read for every request of the round with `IN` lists, and filtered and
//! ordered per request in memory: the result for each request is what its own two queries
//! would have returned.

use std::collections::{HashMap, HashSet};

use mysql_async::prelude::Queryable;
use mysql_async::Row;

use crate::error::ClaimError;
use crate::objects::{object_kind, phid_type, ObjectKind, ObjectTables};
use crate::store::{int, padded, placeholders, text, ClaimStore, IN_CHUNK};

/// Why an object's transactions were not checked against its transaction table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchecked {
    /// The PHID type is not in Phorge's table (an extension application).
    UnknownType(String),
    /// The type has no Lisk table or no transaction table (e.g. `APPS`).
    NoTable(String),
    /// The server refused or did not know the table; `grant` is the statement that fixes it.
    Refused {
        /// The database (with its namespace) the table is in.
        database: String,
        /// The `GRANT SELECT …` that would let the service read it.
        grant: String,
        /// The server's error text.
        error: String,
    },
}

/// The object of a request, loaded as Phorge's worker loads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectLoad {
    /// The object exists. `transactions` is what the payload lists: the stored PHIDs that
    /// exist for this object, newest first — or, when `unchecked` says why that could not be
    /// looked up, the stored list as is.
    Found {
        /// The transaction PHIDs the payload lists.
        transactions: Vec<String>,
        /// Why the transactions could not be checked, when they could not.
        unchecked: Option<Unchecked>,
    },
    /// No such object (or a PHID without a type part): Phorge's `ERROR_OBJECT`.
    Missing,
}

impl ClaimStore {
    /// [`ClaimStore::load_objects`] for one request.
    pub async fn load_object(
        &self,
        object_phid: &str,
        stored: &[String],
    ) -> Result<ObjectLoad, ClaimError> {
        let mut loads = self.load_objects(&[(object_phid, stored)]).await?;
        Ok(loads.pop().unwrap_or(ObjectLoad::Missing))
    }

    /// Loads each request's object (`(object PHID, stored transaction PHIDs)`) as Phorge's
    /// worker does, in the order given: the object must exist in its application's table,
    /// and the payload lists only the stored transaction PHIDs that exist for that object,
    /// newest first.
    ///
    /// When that cannot be checked (a type Phorge's table does not list, a table the
    /// server refuses), the object counts as found and the stored list is used as is;
    /// `unchecked` says why, for the caller to log and count.
    pub async fn load_objects(
        &self,
        requests: &[(&str, &[String])],
    ) -> Result<Vec<ObjectLoad>, ClaimError> {
        let mut out: Vec<Option<ObjectLoad>> = vec![None; requests.len()];
        let mut groups: Vec<(ObjectTables, Vec<usize>)> = Vec::new();
        for (i, (phid, stored)) in requests.iter().enumerate() {
            let kind = || phid_type(phid).unwrap_or("????").to_owned();
            let unchecked = |why| ObjectLoad::Found {
                transactions: stored.to_vec(),
                unchecked: Some(why),
            };
            out[i] = match object_kind(phid) {
                ObjectKind::Malformed => Some(ObjectLoad::Missing),
                ObjectKind::Virtual => Some(unchecked(Unchecked::NoTable(kind()))),
                ObjectKind::Unknown => Some(unchecked(Unchecked::UnknownType(kind()))),
                ObjectKind::Stored(tables) => {
                    match groups.iter_mut().find(|(t, _)| *t == tables) {
                        Some((_, members)) => members.push(i),
                        None => groups.push((tables, vec![i])),
                    }
                    None
                }
            };
        }
        for (tables, members) in groups {
            self.load_group(tables, &members, requests, &mut out)
                .await?;
        }
        Ok(out
            .into_iter()
            .map(|load| load.unwrap_or(ObjectLoad::Missing))
            .collect())
    }

    /// The requests `members` whose objects live in `tables`: two queries for all of them.
    async fn load_group(
        &self,
        tables: ObjectTables,
        members: &[usize],
        requests: &[(&str, &[String])],
        out: &mut [Option<ObjectLoad>],
    ) -> Result<(), ClaimError> {
        let database = format!("{}_{}", self.namespace(), tables.database);
        let objects: Vec<&str> = unique(members.iter().map(|&i| requests[i].0));
        let existing = match self
            .existing_objects(&database, tables.object_table, &objects)
            .await
        {
            Ok(existing) => existing,
            Err(err) if err.is_refused_table() => {
                for &i in members {
                    out[i] = Some(refused(&err, &database, tables.object_table, requests[i].1));
                }
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let mut checked: Vec<usize> = Vec::new();
        for &i in members {
            let (phid, stored) = requests[i];
            if !existing.contains(phid) {
                out[i] = Some(ObjectLoad::Missing);
            } else if tables.transactions.is_none() {
                let kind = phid_type(phid).unwrap_or("????").to_owned();
                out[i] = Some(ObjectLoad::Found {
                    transactions: stored.to_vec(),
                    unchecked: Some(Unchecked::NoTable(kind)),
                });
            } else if stored.is_empty() {
                out[i] = Some(ObjectLoad::Found {
                    transactions: Vec::new(),
                    unchecked: None,
                });
            } else {
                checked.push(i);
            }
        }
        let Some((xaction_db, xaction_table)) = tables.transactions else {
            return Ok(());
        };
        if checked.is_empty() {
            return Ok(());
        }
        let xaction_database = format!("{}_{}", self.namespace(), xaction_db);
        let objects: Vec<&str> = unique(checked.iter().map(|&i| requests[i].0));
        let stored: Vec<&str> = unique(
            checked
                .iter()
                .flat_map(|&i| requests[i].1.iter().map(String::as_str)),
        );
        let found = match self
            .existing_transactions(&xaction_database, xaction_table, &objects, &stored)
            .await
        {
            Ok(found) => found,
            Err(err) if err.is_refused_table() => {
                for &i in &checked {
                    out[i] = Some(refused(
                        &err,
                        &xaction_database,
                        xaction_table,
                        requests[i].1,
                    ));
                }
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        for i in checked {
            let (phid, stored) = requests[i];
            let wanted: HashSet<&str> = stored.iter().map(String::as_str).collect();
            let mut rows: Vec<&(u64, String)> = found
                .get(phid)
                .map(|rows| {
                    rows.iter()
                        .filter(|row| wanted.contains(row.1.as_str()))
                        .collect()
                })
                .unwrap_or_default();
            rows.sort_by_key(|row| std::cmp::Reverse(row.0));
            rows.dedup_by(|a, b| a.1 == b.1);
            out[i] = Some(ObjectLoad::Found {
                transactions: rows.into_iter().map(|row| row.1.clone()).collect(),
                unchecked: None,
            });
        }
        Ok(())
    }

    /// Which of `phids` exist in `database`.`table`.
    async fn existing_objects(
        &self,
        database: &str,
        table: &str,
        phids: &[&str],
    ) -> Result<HashSet<String>, ClaimError> {
        let rows = self
            .select_in(phids, &[], "object query", |list| {
                format!("SELECT phid FROM `{database}`.`{table}` WHERE phid IN ({list})")
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|mut row| text(&mut row, 0))
            .collect())
    }

    /// The rows of `database`.`table` whose object is one of `objects` and whose PHID is one
    /// of `stored`, by object PHID, as `(id, phid)`.
    async fn existing_transactions(
        &self,
        database: &str,
        table: &str,
        objects: &[&str],
        stored: &[&str],
    ) -> Result<HashMap<String, Vec<(u64, String)>>, ClaimError> {
        let mut found: HashMap<String, Vec<(u64, String)>> = HashMap::new();
        for object_chunk in objects.chunks(IN_CHUNK) {
            for chunk in stored.chunks(IN_CHUNK) {
                let mut params = padded(object_chunk.iter().copied());
                let object_count = params.len();
                params.extend(padded(chunk.iter().copied()));
                let sql = format!(
                    "SELECT id, phid, objectPHID FROM `{database}`.`{table}` \
                     WHERE objectPHID IN ({}) AND phid IN ({})",
                    placeholders(object_count),
                    placeholders(params.len() - object_count)
                );
                let mut conn = self.conn().await?;
                let out = self.timed(conn.exec::<Row, _, _>(sql, params)).await;
                let (_conn, rows) = self.settle(conn, out, "transaction query")?;
                for mut row in rows {
                    if let (Some(id), Some(phid), Some(object)) =
                        (int(&mut row, 0), text(&mut row, 1), text(&mut row, 2))
                    {
                        found.entry(object).or_default().push((id, phid));
                    }
                }
            }
        }
        Ok(found)
    }
}

/// The distinct values, in first-seen order.
fn unique<'a>(values: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    values.filter(|value| seen.insert(*value)).collect()
}

/// A request whose application table the server refused or does not know: delivered with
/// the stored list, [`Unchecked::Refused`] saying why.
fn refused(err: &ClaimError, database: &str, table: &str, stored: &[String]) -> ObjectLoad {
    ObjectLoad::Found {
        transactions: stored.to_vec(),
        unchecked: Some(Unchecked::Refused {
            database: database.to_owned(),
            grant: format!("GRANT SELECT ON `{database}`.`{table}` TO <gorge user>"),
            error: err.to_string(),
        }),
    }
}
