//! The database URL: which backend, whether its server answers, and the URL without its
//! password for messages and the log.

use std::time::Duration;

use outbox::sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::Failure;

pub(crate) async fn connect(url: Option<&str>) -> Result<DatabaseConnection, Failure> {
    let url = url.ok_or(
        "no database given: pass --database-url URL or set DATABASE_URL \
         (postgres://…, mysql://…, sqlite://path?mode=rwc)",
    )?;
    let scheme = url
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let (feature, compiled) = match scheme.as_str() {
        "postgres" | "postgresql" => ("postgres", cfg!(feature = "postgres")),
        "mysql" | "mariadb" => ("mysql", cfg!(feature = "mysql")),
        "sqlite" => ("sqlite", cfg!(feature = "sqlite")),
        _ => {
            return Err(format!(
                "unsupported database URL `{}`: use postgres://…, mysql://… or sqlite://…",
                redact(url)
            )
            .into());
        }
    };
    if !compiled {
        return Err(format!(
            "this outbox binary was built without {feature} support: rebuild it with \
             `--features cli,{feature}`"
        )
        .into());
    }
    if let Some((host, port)) = server_address(url, &scheme) {
        // The pool retries an unreachable server until its timeout and then reports only
        // "pool timed out": say why at once instead.
        let connect = tokio::net::TcpStream::connect((host.as_str(), port));
        match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(
                    format!("cannot connect to {}: {host}:{port}: {e}", redact(url)).into(),
                );
            }
            Err(_) => {
                return Err(format!(
                    "cannot connect to {}: {host}:{port} did not answer within 10 s",
                    redact(url)
                )
                .into());
            }
        }
    }
    let mut options = ConnectOptions::new(url.to_owned());
    options
        .sqlx_logging(false)
        .max_connections(2)
        .min_connections(0)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(30));
    Database::connect(options)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", redact(url)).into())
}

/// `host:port` of a PostgreSQL or MySQL URL (`None` for SQLite, Unix sockets, or what this
/// simple parser does not understand: the driver then reports on its own).
pub(crate) fn server_address(url: &str, scheme: &str) -> Option<(String, u16)> {
    let default_port = match scheme {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        _ => return None,
    };
    let rest = &url[url.find("://")? + 3..];
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() || host.contains(',') {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port,
    };
    Some((host.to_owned(), port))
}

/// The URL without its password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
