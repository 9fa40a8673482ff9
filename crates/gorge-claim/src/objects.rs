//! Where Phorge stores each kind of object and its transactions, from
//! `compat/phorge-object-tables.tsv` (read off Phorge by instantiating every PHID type).
//!
//! Phorge's worker loads a request's object and its transactions before it sends anything;
//! this table lets the store run the same two lookups with plain SQL.

use std::collections::HashMap;
use std::sync::OnceLock;

const TABLES_TSV: &str = include_str!("../../../compat/phorge-object-tables.tsv");

/// The tables of one PHID type. Database names are without the `{namespace}_` prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectTables {
    /// The database holding the objects (`maniphest`, `differential`…).
    pub database: &'static str,
    /// The object table, whose `phid` column the request's object PHID is looked up in.
    pub object_table: &'static str,
    /// `None` when the type has no transactions.
    pub transactions: Option<(&'static str, &'static str)>,
}

/// How a PHID's type is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// Listed, with a Lisk table to look the object up in.
    Stored(ObjectTables),
    /// Listed without a table (e.g. `APPS`): Phorge loads such objects without SQL.
    Virtual,
    /// Not listed: an extension application this service does not know.
    Unknown,
    /// No `PHID-XXXX-` type part at all.
    Malformed,
}

fn table() -> &'static HashMap<&'static str, Option<ObjectTables>> {
    static TABLE: OnceLock<HashMap<&'static str, Option<ObjectTables>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        TABLES_TSV
            .lines()
            .filter(|line| !line.starts_with('#') && !line.starts_with("phid_type\t"))
            .filter_map(|line| {
                let cells: Vec<&'static str> = line.split('\t').collect();
                let cell = |i: usize| cells.get(i).copied().filter(|c| !c.is_empty());
                let kind = cell(0)?;
                let tables = match (cell(2), cell(3)) {
                    (Some(database), Some(object_table)) => Some(ObjectTables {
                        database,
                        object_table,
                        transactions: cell(4).zip(cell(5)),
                    }),
                    _ => None,
                };
                Some((kind, tables))
            })
            .collect()
    })
}

/// The type part of a PHID (`PHID-TASK-…` → `TASK`), as Phorge's `phid_get_type`.
pub fn phid_type(phid: &str) -> Option<&str> {
    let rest = phid.strip_prefix("PHID-")?;
    let (kind, _) = rest.split_once('-')?;
    (kind.len() == 4).then_some(kind)
}

/// Where the object named by `phid` lives.
pub fn object_kind(phid: &str) -> ObjectKind {
    let Some(kind) = phid_type(phid) else {
        return ObjectKind::Malformed;
    };
    match table().get(kind) {
        Some(Some(tables)) => ObjectKind::Stored(*tables),
        Some(None) => ObjectKind::Virtual,
        None => ObjectKind::Unknown,
    }
}

/// Number of PHID types in the table (for tests and docs).
pub fn known_types() -> usize {
    table().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_and_hooks_are_where_phorge_keeps_them() {
        assert_eq!(
            object_kind("PHID-TASK-npi3b5olcwxb6qqsaumd"),
            ObjectKind::Stored(ObjectTables {
                database: "maniphest",
                object_table: "maniphest_task",
                transactions: Some(("maniphest", "maniphest_transaction")),
            })
        );
        assert!(matches!(
            object_kind("PHID-HWBH-x"),
            ObjectKind::Stored(ObjectTables {
                database: "herald",
                object_table: "herald_webhook",
                ..
            })
        ));
        assert_eq!(
            object_kind("PHID-APPS-PhabricatorHeraldApplication"),
            ObjectKind::Virtual
        );
        assert_eq!(object_kind("PHID-ZZZZ-x"), ObjectKind::Unknown);
        assert_eq!(object_kind("not-a-phid"), ObjectKind::Malformed);
        assert_eq!(object_kind("PHID-TOOLONG-x"), ObjectKind::Malformed);
        assert!(known_types() > 100);
    }
}
