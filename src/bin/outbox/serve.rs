//! `outbox serve`: the operator console.

use outbox::{admin::DoctorOptions, sea_orm::DatabaseConnection};

use crate::{
    Failure,
    args::{ServeArgs, named_or_user},
    commands::sdk_migrations,
    connect::{self, redact},
    set::{self, Entry},
};

/// What `outbox serve` serves.
pub(crate) enum Served {
    /// One database (`--database-url`, or `--database NAME` of the set).
    One(Option<String>),
    /// Every database of `--databases FILE`.
    Set(Vec<Entry>),
}

/// `outbox serve`: the console on `--listen` until Ctrl-C or SIGTERM.
pub(crate) async fn serve(served: Served, args: ServeArgs) -> Result<(), Failure> {
    use outbox::console::{Console, ConsoleAuth};

    if !args.listen.ip().is_loopback() && !args.public {
        return Err(format!(
            "refusing to listen on {}, which is not a loopback address: pass --public to serve \
             the console to the network",
            args.listen
        )
        .into());
    }
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?,
        None => std::env::var("OUTBOX_CONSOLE_TOKEN").map_err(|_| {
            "no console token: set OUTBOX_CONSOLE_TOKEN or pass --token-file (e.g. from `openssl rand -hex 32`)"
        })?,
    };
    let operator = named_or_user(args.operator).unwrap_or_else(|| "console".to_owned());
    let auth = ConsoleAuth::bearer(operator.as_str(), token.trim())?;
    let (console, what) = match served {
        Served::One(url) => {
            let db: DatabaseConnection = connect::connect(url.as_deref()).await?;
            let what = redact(url.as_deref().unwrap_or_default());
            (Console::new(db, auth), what)
        }
        Served::Set(entries) => {
            let control = set::control(
                args.owners.control_url.as_deref(),
                args.owners.group.as_deref(),
            )
            .await?;
            // A database that cannot be connected is served unconnected: the console lists it
            // with its error, and the others are served.
            let (databases, _) = set::connect_each(&entries).await;
            let what = format!("{} databases of the set", databases.len());
            let console = Console::for_set(databases, auth);
            let console = match control {
                Some((control, group)) => console.control(control, group),
                None => console,
            };
            (console, what)
        }
    };
    let console =
        console.doctor_options(DoctorOptions::new(sdk_migrations()).without_handler_check());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(
        url = %format_args!("http://{address}/"),
        database = %what,
        auth = "bearer token",
        operator = %operator,
        public = args.public,
        "outbox console serving (Ctrl-C or SIGTERM stops it)"
    );
    console.serve(listener, stopped()).await?;
    tracing::info!("outbox console stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
pub(crate) async fn stopped() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
