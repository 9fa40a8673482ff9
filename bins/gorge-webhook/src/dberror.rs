//! Database errors as an operator reads them in `/readyz` and `WEBHOOK_POLL_ERROR`: the
//! driver's own words say neither where it tried to connect nor what fixes the usual
//! mistakes, so this adds the address (host and port, or the socket) and, for an account
//! made the way Phorge's docs make them, the fix.

use std::fmt;

use gorge_claim::ClaimError;

use gorge_service::settings::Declared;

use crate::config::{Database, RawSettings};

/// The server's "Access denied for user" errors: MySQL/MariaDB `ER_ACCESS_DENIED_ERROR`
/// (1045: no account matches this user, host and password) and MariaDB's
/// `ER_ACCESS_DENIED_NO_PASSWORD_ERROR` (1698), which MariaDB 10.11 here answers for the same
/// wrong account now and then (seen in tests/service.rs); both have the same causes and fix.
const ACCESS_DENIED: [u16; 2] = [1045, 1698];

/// Where and as whom the service connects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DbEndpoint {
    /// `host:port` (TCP), or the socket's path when `GORGE_WEBHOOK_MYSQL_SOCKET` is set.
    pub address: String,
    /// Whether `address` is a Unix socket.
    pub socket: bool,
    /// The MySQL user name.
    pub user: String,
}

impl DbEndpoint {
    /// The endpoint `database` names.
    pub fn of(database: &Database) -> DbEndpoint {
        DbEndpoint {
            address: match &database.socket {
                Some(path) => path.clone(),
                None => database.address(),
            },
            socket: database.socket.is_some(),
            user: database.user.clone(),
        }
    }
}

/// A setting's variable, as these messages name it.
fn var(key: &str) -> String {
    RawSettings::env_var(key)
}

impl fmt::Display for DbEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = RawSettings::KEYS;
        match self.socket {
            true => write!(
                f,
                "socket {} as '{}' ({})",
                self.address,
                self.user,
                var(key.mysql_socket)
            ),
            false => write!(
                f,
                "{} as '{}' ({}, {})",
                self.address,
                self.user,
                var(key.mysql_host),
                var(key.mysql_port)
            ),
        }
    }
}

/// `err` in one line, with where the service connects when the connection itself failed,
/// and the fix for an access denied over TCP.
pub fn explain(err: &ClaimError, at: &DbEndpoint) -> String {
    let text = err.to_string();
    let line = match err {
        ClaimError::Database(mysql_async::Error::Io(_) | mysql_async::Error::Driver(_))
        | ClaimError::Timeout("waiting for a database connection") => {
            format!("{text} (connecting to {at})")
        }
        ClaimError::Database(mysql_async::Error::Server(server))
            if ACCESS_DENIED.contains(&server.code) && !at.socket =>
        {
            // Phorge's docs create `'user'@'localhost'`, which MySQL matches only for socket
            // connections; over TCP it sees the client's address instead (shown as
            // 'localhost' when the server resolves 127.0.0.1 to that name).
            format!(
                "{text} (connecting to {at}): check {user_var} and {pass_var} — the password is \
                 wrong, or no account '{user}' matches the address the server names above. An \
                 account made as '{user}'@'localhost' matches only socket connections unless the \
                 server resolves this client to localhost: create '{user}'@'<that address>' with \
                 the same password and grants, or set {socket} to the server's socket \
                 (e.g. /run/mysqld/mysqld.sock)",
                user = at.user,
                user_var = var(RawSettings::KEYS.mysql_user),
                pass_var = var(RawSettings::KEYS.mysql_pass),
                socket = var(RawSettings::KEYS.mysql_socket)
            )
        }
        ClaimError::Database(mysql_async::Error::Server(server))
            if ACCESS_DENIED.contains(&server.code) =>
        {
            format!(
                "{text} (connecting to {at}): check {} and {}",
                var(RawSettings::KEYS.mysql_user),
                var(RawSettings::KEYS.mysql_pass)
            )
        }
        ClaimError::UnknownDatabase { .. } => format!(
            "{text} — or {} is not Phorge's storage.default-namespace (the database is \
             {{namespace}}_herald)",
            var(RawSettings::KEYS.namespace)
        ),
        _ => text,
    };
    // One line, whatever the driver said.
    line.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp() -> DbEndpoint {
        DbEndpoint {
            address: "127.0.0.1:3306".into(),
            socket: false,
            user: "gorge".into(),
        }
    }

    fn server_error(code: u16, message: &str) -> ClaimError {
        ClaimError::Database(mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: message.into(),
            state: "28000".into(),
        }))
    }

    /// Both of the server's access-denied codes get the fix for a 'localhost' account: MariaDB
    /// answers a wrong TCP account with 1698 as well as 1045.
    #[test]
    fn both_access_denied_codes_get_the_localhost_fix() {
        for code in [1045, 1698] {
            let denied = server_error(code, "Access denied for user 'gorge'@'127.0.0.1'");
            let line = explain(&denied, &tcp());
            assert!(
                line.starts_with(&format!(
                    "{denied} (connecting to 127.0.0.1:3306 as 'gorge'"
                )) && line.contains("matches only socket connections")
                    && line.contains("check GORGE_WEBHOOK_MYSQL_USER and GORGE_WEBHOOK_MYSQL_PASS"),
                "{code}: {line}"
            );
        }
    }

    /// A database that does not exist may be a namespace that is not Phorge's.
    #[test]
    fn an_unknown_database_names_the_namespace_setting() {
        let missing = ClaimError::UnknownDatabase {
            database: "phorge_herald".into(),
        };
        assert_eq!(
            explain(&missing, &tcp()),
            "unknown database `phorge_herald` (has Phorge's `bin/storage upgrade` run?) — or \
             GORGE_WEBHOOK_NAMESPACE is not Phorge's storage.default-namespace (the database is \
             {namespace}_herald)"
        );
    }

    #[test]
    fn a_failed_connection_names_where_it_went() {
        let refused = ClaimError::Database(mysql_async::Error::Io(mysql_async::IoError::Io(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        )));
        assert_eq!(
            explain(&refused, &tcp()),
            format!(
                "{refused} (connecting to 127.0.0.1:3306 as 'gorge' (GORGE_WEBHOOK_MYSQL_HOST, \
                 GORGE_WEBHOOK_MYSQL_PORT))"
            )
        );
        let socket = DbEndpoint {
            address: "/run/mysqld/mysqld.sock".into(),
            socket: true,
            user: "gorge".into(),
        };
        let waited = ClaimError::Timeout("waiting for a database connection");
        assert_eq!(
            explain(&waited, &socket),
            "database timeout: waiting for a database connection (connecting to socket \
             /run/mysqld/mysqld.sock as 'gorge' (GORGE_WEBHOOK_MYSQL_SOCKET))"
        );
        // Other errors are the driver's words alone.
        let other = server_error(1146, "Table 'x.y' doesn't exist");
        assert_eq!(explain(&other, &tcp()), other.to_string());
        assert_eq!(
            explain(&ClaimError::Timeout("claim"), &tcp()),
            "database timeout: claim"
        );
    }
}
