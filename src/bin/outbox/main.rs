//! `outbox`: the operations CLI of the outbox SDK (feature `cli`).
//!
//! ```text
//! outbox --database-url postgres://… status
//! outbox dead list --consumer inventory --error timeout --limit 20 --page 2
//! outbox dead show inbox:17
//! outbox replay --id outbox:12 --id inbox:17 --actor alice --reason "stock service fixed"
//! outbox replay --consumer inventory --type order.placed
//! outbox ignore inbox:18 inbox:19 --reason "order was cancelled"
//! outbox ignore --consumer inventory --error "unknown sku" --reason "discontinued items"
//! outbox resend 0193c1e4-4f9b-7c3a-9d1e-2b5f8a6c0e71
//! outbox resend --type order.placed --sent-after 2026-12-03T10:00:00Z --sent-before 2026-12-03T11:00:00Z
//! outbox purge --sent-after 7d --done-after 14d
//! outbox doctor
//! outbox pause consumer inventory --reason "stock service down"
//! outbox pause destination shop.order.placed
//! outbox resume consumer inventory
//! outbox pauses
//! outbox audit --limit 20
//! outbox migrate
//! outbox --databases tenants.conf --database acme dead list     # one database of a set
//! outbox --databases tenants.conf migrate --all
//! outbox --databases tenants.conf status --all --control-url postgres://… --group order-service
//! OUTBOX_CONSOLE_TOKEN=… outbox serve --listen 127.0.0.1:8080   # feature `console`
//! outbox --databases tenants.conf serve --control-url postgres://… --group order-service
//! outbox catalogue --from events.catalogue.json asyncapi --transport kafka --namespace shop
//! ```
//!
//! Human-readable tables by default, `--json` for scripts. Exit status: 0 done, 1 error (for
//! `migrate --all`: a database was not migrated), 2 bad command line, 3 an action left some of
//! the rows asked for unchanged, 4 `doctor` found errors, 5 `status --all` found a database
//! nobody owns or that cannot be read (for an alert script to act on).
//!
//! **A set of databases** (a database per tenant, served by `outbox::fleet`) is a file given
//! with `--databases FILE` (or `OUTBOX_DATABASES`): one `name = url` a line, blank lines and
//! `#` comment lines skipped, names checked as the fleet checks them, each once. `--database
//! NAME` picks one of them for any command; `migrate --all` migrates every one (going on past
//! one that fails), `status --all` shows a row each: its owner (with `--control-url` and
//! `--group`, the fleet's control database and group; `UNOWNED` when nobody holds its lease),
//! pending events and the age of the oldest, dead rows, inbox backlog; `serve` without
//! `--database` serves one console over the whole set (a database selector, every database's
//! owner and oldest pending age, the unowned highlighted; with `--control-url` and `--group` for
//! the owners). The file holds
//! passwords: nothing the CLI prints shows one (URLs are shown with the password masked, a bad
//! line by its number only).
//!
//! What the tables show comes from the database and may hold anyone's text: control characters
//! (terminal escape sequences among them) and bidirectional overrides are printed escaped
//! (`\x1b`, `\u{202e}`), lists show an error's first line cut to the column, `dead show` the
//! whole text; `--json` prints every value exactly. The log goes to standard error, filtered by
//! `RUST_LOG` (default `info` for `serve`, `purge` and `migrate`, `warn` for the rest), as text or
//! with `--log-format json` as one JSON object per line.

//!
//! One module a role: `args` (the command line), `connect` (the database URL), `commands` (one
//! function a command), `render` (tables and escaping), `serve` (the console), `set` (the set of
//! databases of `--databases`).

mod args;
mod commands;
mod connect;
mod render;
#[cfg(feature = "console")]
mod serve;
mod set;

use std::{fmt::Write as _, process::ExitCode};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum, parser::ValueSource};

#[cfg(feature = "console")]
use args::ServeArgs;
use args::{
    DeadCommand, IgnoreArgs, MigrateArgs, PauseArgs, PurgeArgs, ReplayArgs, ResendArgs, StatusArgs,
};
use render::printable;

const AFTER_HELP: &str = "Exit status: 0 done, 1 error (`migrate --all`: a database was not \
migrated), 2 bad command line, 3 an action left some of the rows asked for unchanged, \
4 `doctor` found errors, 5 `status --all` found a database nobody owns or that cannot be read.

A set of databases (--databases FILE): one `name = url` a line, `#` comments and blank lines \
allowed. --database NAME picks one of them for any command; `migrate --all`, \
`status --all` and `serve` (without --database) run over all of them.";

/// Operate the transactional outbox and inbox: see what is stuck, how far behind each consumer
/// is and what died, and fix it.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, after_help = AFTER_HELP)]
struct Cli {
    /// Database URL: postgres://…, mysql://… or sqlite://…
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// A set of databases: a file with one `name = url` a line (for --database, `migrate --all`,
    /// `status --all` and `serve`).
    #[arg(long, env = "OUTBOX_DATABASES", global = true, value_name = "FILE")]
    databases: Option<std::path::PathBuf>,
    /// Work on this database of the --databases file (instead of --database-url).
    #[arg(long, global = true, value_name = "NAME")]
    database: Option<String>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// How the log on standard error is written (`RUST_LOG` says what it holds).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// One line of text per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Counts per status, backlog and its oldest age, consumer lag, dead and stuck rows; with
    /// --all, a row for every database of the set with its owner.
    Status(StatusArgs),
    /// List or show dead letters.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Give dead letters another chance: outbox DEAD → PENDING, inbox DEAD → RETRY due now.
    Replay(ReplayArgs),
    /// Decide not to handle dead inbox messages: DEAD → IGNORED (by id, by filter, or --all).
    Ignore(IgnoreArgs),
    /// Publish sent outbox events again: SENT → PENDING (by event id or by filter).
    Resend(ResendArgs),
    /// Delete SENT outbox events and DONE/IGNORED inbox messages older than the retention now.
    Purge(PurgeArgs),
    /// Pause a consumer (it takes no message; nothing is nacked) or the publishing of a
    /// destination (its events wait PENDING, no attempt spent). Every instance honours it within
    /// seconds; audited.
    Pause(PauseArgs),
    /// Resume a paused consumer or destination; audited.
    Resume(PauseArgs),
    /// The consumers and destinations paused now, with who paused them, when and why.
    Pauses,
    /// Check tables, columns, indexes, migrations, stuck rows and dead letters.
    Doctor,
    /// Show the latest admin actions.
    Audit {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Apply the SDK's migrations (idempotent); with --all, to every database of the set.
    Migrate(MigrateArgs),
    /// Serve the operator console (web page and REST API) until interrupted; with --databases
    /// FILE and no --database, one console over every database of the set. The token comes
    /// from OUTBOX_CONSOLE_TOKEN or --token-file, never from the command line.
    #[cfg(feature = "console")]
    Serve(ServeArgs),
    /// The event catalogue from a file (`--from FILE`): render it as AsyncAPI, or check a
    /// service's catalogue against the committed one. `outbox catalogue help` for the commands.
    /// Print and write a catalogue from the service's own binary, which links its events
    /// (`outbox::catalogue::cli::run`).
    #[command(disable_help_flag = true)]
    Catalogue {
        /// `[--from FILE] [json | write FILE | check FILE | asyncapi [OPTIONS] | help]`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// An error for the user: printed as `error: …`, exit status 1 (2 for a [`Usage`]).
pub(crate) type Failure = Box<dyn std::error::Error>;

/// A command line that cannot be carried out as given (exit status 2, like clap's own errors).
#[derive(Debug)]
pub(crate) struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

pub(crate) fn usage(error: impl std::fmt::Display) -> Failure {
    Box::new(Usage(error.to_string()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Command::Catalogue { args } = cli.command {
        return outbox::catalogue::cli::run(args);
    }
    init_log(&cli);
    // `--database NAME` beats a `DATABASE_URL` from the environment, not a `--database-url`.
    let url_on_command_line =
        matches.value_source("database_url") == Some(ValueSource::CommandLine);
    match run(cli, url_on_command_line).await {
        Ok(code) => code,
        Err(e) => {
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                let text = s.to_string();
                if !message.contains(&text) {
                    let _ = write!(message, ": {text}");
                }
                source = s.source();
            }
            eprintln!("error: {}", printable(&message, true));
            ExitCode::from(if e.is::<Usage>() { 2 } else { 1 })
        }
    }
}

/// The log on standard error: `RUST_LOG`'s filter, else `info` for the long-running commands
/// and `warn` for the rest; text or JSON lines.
fn init_log(cli: &Cli) {
    use tracing_subscriber::EnvFilter;

    let long_running = match &cli.command {
        Command::Purge(_) | Command::Migrate(_) => true,
        #[cfg(feature = "console")]
        Command::Serve(_) => true,
        _ => false,
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(if long_running { "info" } else { "warn" }));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cli.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Open the database (or the set's) and run the command.
async fn run(cli: Cli, url_on_command_line: bool) -> Result<ExitCode, Failure> {
    let given = set::Given {
        url: cli.database_url.as_deref(),
        url_on_command_line,
        file: cli.databases.as_ref(),
        name: cli.database.as_deref(),
    };
    let json = cli.json;
    match &cli.command {
        Command::Migrate(MigrateArgs { all: true }) => {
            return set::migrate_all(&given.all("migrate")?, json).await;
        }
        Command::Status(args) if args.all => {
            return set::status_all(&given.all("status")?, args, json).await;
        }
        _ => {}
    }
    #[cfg(feature = "console")]
    if let Command::Serve(args) = cli.command {
        let served = match given.set_to_serve()? {
            Some(entries) => serve::Served::Set(entries),
            None => serve::Served::One(given.one()?),
        };
        serve::serve(served, args).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let url = given.one()?;
    let db = connect::connect(url.as_deref()).await?;
    match cli.command {
        Command::Status(_) => commands::status(&db, json).await,
        Command::Dead(DeadCommand::List {
            filter,
            limit,
            page,
        }) => commands::dead_list(&db, json, &filter, limit, page).await,
        Command::Dead(DeadCommand::Groups { filter }) => {
            commands::dead_groups(&db, json, &filter).await
        }
        Command::Dead(DeadCommand::Show { id }) => commands::dead_show(&db, json, &id).await,
        Command::Replay(args) => commands::replay(&db, json, &args).await,
        Command::Ignore(args) => commands::ignore(&db, json, &args).await,
        Command::Resend(args) => commands::resend(&db, json, &args).await,
        Command::Purge(args) => commands::purge(&db, json, &args).await,
        Command::Pause(args) => commands::pause(&db, json, &args, true).await,
        Command::Resume(args) => commands::pause(&db, json, &args, false).await,
        Command::Pauses => commands::pauses(&db, json).await,
        Command::Doctor => commands::doctor(&db, json).await,
        Command::Audit { limit } => commands::audit(&db, json, limit).await,
        Command::Migrate(_) => commands::migrate(&db, json).await,
        #[cfg(feature = "console")]
        Command::Serve(_) => unreachable!("served above"),
        // Handled in `main`, before any database is opened.
        Command::Catalogue { args } => Ok(outbox::catalogue::cli::run(args)),
    }
}
