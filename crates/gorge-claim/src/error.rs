//! The one error type of the claim store, with reasons fit for `/readyz`.

use std::fmt;

/// MySQL/MariaDB `ER_BAD_DB_ERROR`: the `{namespace}_herald` database does not exist.
const ER_BAD_DB_ERROR: u16 = 1049;

/// Server errors that mean "this user may not read that table" or "no such table or
/// database": `ER_DBACCESS_DENIED_ERROR`, `ER_BAD_DB_ERROR`, `ER_TABLEACCESS_DENIED_ERROR`,
/// `ER_COLUMNACCESS_DENIED_ERROR`, `ER_NO_SUCH_TABLE`.
const REFUSED_TABLE_ERRORS: [u16; 5] = [1044, ER_BAD_DB_ERROR, 1142, 1143, 1146];

/// `ER_DBACCESS_DENIED_ERROR`, `ER_TABLEACCESS_DENIED_ERROR`, `ER_COLUMNACCESS_DENIED_ERROR`.
const ACCESS_DENIED_ERRORS: [u16; 3] = [1044, 1142, 1143];

/// `ER_NO_SUCH_TABLE`: the database exists, the table does not (an older Phorge, or
/// `bin/storage upgrade` not finished).
const ER_NO_SUCH_TABLE: u16 = 1146;

/// Server errors caused by a row's values: `ER_BAD_NULL_ERROR`, `ER_WARN_DATA_OUT_OF_RANGE`,
/// `WARN_DATA_TRUNCATED`, `ER_TRUNCATED_WRONG_VALUE`, `ER_TRUNCATED_WRONG_VALUE_FOR_FIELD`,
/// `ER_DATA_TOO_LONG`, and MariaDB's `ER_CONSTRAINT_FAILED` (e.g. a JSON check).
const ROW_DATA_ERRORS: [u16; 7] = [1048, 1264, 1265, 1292, 1366, 1406, 4025];

/// Why a claim-store operation failed.
#[derive(Debug)]
pub enum ClaimError {
    /// The database does not exist (Phorge has not run `bin/storage upgrade` yet).
    /// Not ready, but not a crash: callers keep retrying.
    UnknownDatabase {
        /// The database name that was tried.
        database: String,
    },
    /// Any other driver, network or server error.
    Database(mysql_async::Error),
    /// The server answered `NULL` where a value is required (e.g. `GET_LOCK` failed).
    UnexpectedNull(&'static str),
    /// A statement (or the wait for a connection) did not finish within the query timeout;
    /// its connection was closed.
    Timeout(&'static str),
    /// A row read from the server cannot be used as stored (e.g. bytes that are not UTF-8).
    InvalidRow(&'static str),
}

impl ClaimError {
    /// Classifies a driver error, naming the database when it is the missing one.
    pub(crate) fn from_driver(err: mysql_async::Error, database: &str) -> Self {
        match &err {
            mysql_async::Error::Server(server) if server.code == ER_BAD_DB_ERROR => {
                ClaimError::UnknownDatabase {
                    database: database.to_owned(),
                }
            }
            _ => ClaimError::Database(err),
        }
    }

    /// True when the server rejected a statement because of the values of the row it is
    /// about (a value out of range, too long, not valid for its column) — as opposed to a
    /// lost connection, a timeout, a missing privilege or database: repeating it for the
    /// same row will fail the same way, while other rows are fine.
    pub fn is_row_data_error(&self) -> bool {
        match self {
            ClaimError::Database(mysql_async::Error::Server(server)) => {
                ROW_DATA_ERRORS.contains(&server.code)
            }
            _ => false,
        }
    }

    /// True when this user may not read a table, or the table or its database does not
    /// exist: an application table gorge cannot check, not a failure of the row.
    pub fn is_refused_table(&self) -> bool {
        match self {
            ClaimError::UnknownDatabase { .. } => true,
            ClaimError::Database(mysql_async::Error::Server(server)) => {
                REFUSED_TABLE_ERRORS.contains(&server.code)
            }
            _ => false,
        }
    }

    /// True when the server refused a statement for a missing privilege on a database,
    /// table or column (not for a table that does not exist).
    pub fn is_access_denied(&self) -> bool {
        match self {
            ClaimError::Database(mysql_async::Error::Server(server)) => {
                ACCESS_DENIED_ERRORS.contains(&server.code)
            }
            _ => false,
        }
    }

    /// True when the failure is the missing `{namespace}_herald` database.
    pub fn is_unknown_database(&self) -> bool {
        matches!(self, ClaimError::UnknownDatabase { .. })
    }
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::UnknownDatabase { database } => write!(
                f,
                "unknown database `{database}` (has Phorge's `bin/storage upgrade` run?)"
            ),
            ClaimError::Database(mysql_async::Error::Server(server))
                if server.code == ER_NO_SUCH_TABLE =>
            {
                write!(
                    f,
                    "database error: {} (has Phorge's `bin/storage upgrade` run?)",
                    server.message
                )
            }
            // The driver's text repeats its prefix ("Input/output error: Input/output
            // error: …"): the cause once.
            ClaimError::Database(mysql_async::Error::Io(mysql_async::IoError::Io(err))) => {
                write!(f, "database connection error: {err}")
            }
            ClaimError::Database(err) => write!(f, "database error: {err}"),
            ClaimError::UnexpectedNull(what) => write!(f, "unexpected NULL from {what}"),
            ClaimError::Timeout(what) => write!(f, "database timeout: {what}"),
            ClaimError::InvalidRow(why) => write!(f, "invalid row: {why}"),
        }
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClaimError::Database(err) => Some(err),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_error_says_its_cause_once() {
        let err = ClaimError::Database(mysql_async::Error::Io(mysql_async::IoError::Io(
            std::io::Error::from_raw_os_error(5),
        )));
        assert_eq!(
            err.to_string(),
            "database connection error: Input/output error (os error 5)"
        );
    }

    fn server(code: u16) -> ClaimError {
        ClaimError::Database(mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: String::new(),
            state: String::new(),
        }))
    }

    #[test]
    fn refused_tables_are_privileges_and_missing_tables_only() {
        for code in [1044, 1049, 1142, 1143, 1146] {
            assert!(server(code).is_refused_table(), "{code}");
        }
        assert!(ClaimError::UnknownDatabase {
            database: "x_herald".into()
        }
        .is_refused_table());
        assert!(!server(1264).is_refused_table());
        assert!(!ClaimError::Timeout("claim").is_refused_table());
    }

    #[test]
    fn only_value_errors_are_blamed_on_the_row() {
        // Out of range: the poison row (dateModified = 4294967295).
        assert!(server(1264).is_row_data_error());
        // A missing privilege or table concerns every row: never a reason to fail one.
        assert!(!server(1142).is_row_data_error());
        assert!(!server(1146).is_row_data_error());
        assert!(!ClaimError::Timeout("claim").is_row_data_error());
    }
}
