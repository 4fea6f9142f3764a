//! The operator console over the quickstart's SQLite database, which holds a dead letter.
//!
//! ```sh
//! cargo run --example quickstart
//! OUTBOX_CONSOLE_TOKEN=$(openssl rand -hex 32) cargo run --example console --features console
//! ```
//!
//! Then open <http://127.0.0.1:8080/> and log in with the token: the counts, the consumers'
//! backlog and lag, the dead letter with its payload and error, replay or ignore with a reason,
//! and the audit trail. The same router mounts in any axum application
//! (`outbox::console::router(db, auth)`).

use outbox::console::ConsoleAuth;
use outbox::sea_orm::Database;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("outbox-quickstart.db");
    if !path.exists() {
        return Err(format!(
            "{} does not exist: run `cargo run --example quickstart` first",
            path.display()
        )
        .into());
    }
    let token = std::env::var("OUTBOX_CONSOLE_TOKEN").map_err(|_| {
        "set OUTBOX_CONSOLE_TOKEN to a secret of at least 16 characters, e.g. `openssl rand -hex 32`"
    })?;
    let db = Database::connect(format!("sqlite://{}?mode=rw", path.display())).await?;
    let app = outbox::console::router(db, ConsoleAuth::bearer("operator", &token)?);

    // Loopback only: serving the console to the network is a decision to take explicitly.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    println!(
        "outbox console on http://127.0.0.1:8080/ (log in with OUTBOX_CONSOLE_TOKEN; Ctrl-C stops it)"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
