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
//! outbox audit --limit 20
//! outbox migrate
//! OUTBOX_CONSOLE_TOKEN=… outbox serve --listen 127.0.0.1:8080   # feature `console`
//! outbox catalogue --from events.catalogue.json asyncapi --transport kafka --namespace shop
//! ```
//!
//! Human-readable tables by default, `--json` for scripts. Exit status: 0 done, 1 error, 2 bad
//! command line, 3 an action left some of the rows asked for unchanged, 4 `doctor` found errors.
//!
//! What the tables show comes from the database and may hold anyone's text: control characters
//! (terminal escape sequences among them) and bidirectional overrides are printed escaped
//! (`\x1b`, `\u{202e}`), lists show an error's first line cut to the column, `dead show` the
//! whole text; `--json` prints every value exactly. The log goes to standard error, filtered by
//! `RUST_LOG` (default `info` for `serve`, `purge` and `migrate`, `warn` for the rest), as text or
//! with `--log-format json` as one JSON object per line.

use std::{fmt::Write as _, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox::{
    EventId,
    admin::{
        self, ActionReport, Actor, DeadLetter, DeadLetterDetail, DeadLetterFilter, DoctorOptions,
        DoctorReport, HumanDuration, Page, Resend, Selector, SentFilter, Severity, Source, Status,
        Target, bounds,
    },
    retention::{self, PurgeReport, RetentionPolicy},
    sea_orm::{ConnectOptions, Database, DatabaseConnection, prelude::DateTimeUtc},
};
use serde_json::Value;

const AFTER_HELP: &str = "Exit status: 0 done, 1 error, 2 bad command line, \
3 an action left some of the rows asked for unchanged, 4 `doctor` found errors.";

/// Operate the transactional outbox and inbox: see what is stuck, how far behind each consumer
/// is and what died, and fix it.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, after_help = AFTER_HELP)]
struct Cli {
    /// Database URL: postgres://…, mysql://… or sqlite://…
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
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
    /// Counts per status, backlog and its oldest age, consumer lag, dead and stuck rows.
    Status,
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
    /// Check tables, columns, indexes, migrations, stuck rows and dead letters.
    Doctor,
    /// Show the latest admin actions.
    Audit {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Apply the SDK's migrations (idempotent).
    Migrate,
    /// Serve the operator console (web page and REST API) until interrupted. The token comes
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

#[cfg(feature = "console")]
#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on. Anything but a loopback address also needs --public.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Accept a --listen address that is not loopback: the console is then reachable from the
    /// network (put TLS in front of it).
    #[arg(long)]
    public: bool,
    /// Who the token acts as, in the audit log (default: $USER).
    #[arg(long, value_name = "NAME")]
    operator: Option<String>,
    /// A file holding the console token (at least 16 characters); else OUTBOX_CONSOLE_TOKEN.
    #[arg(long, value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum DeadCommand {
    /// Dead letters, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Rows per page.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Page number, from 1.
        #[arg(long, default_value_t = 1)]
        page: u64,
    },
    /// One row in full: envelope, payload, attempts, last error, timestamps.
    Show {
        /// `outbox:ID` or `inbox:ID`, as `dead list` shows.
        id: String,
    },
}

#[derive(Debug, Args, Default)]
struct FilterArgs {
    /// Only this consumer's inbox messages.
    #[arg(long)]
    consumer: Option<String>,
    /// Only this event type.
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, value_name = "AGGREGATE_ID")]
    aggregate: Option<String>,
    /// Only rows whose last error contains this text (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only the outbox or only the inbox.
    #[arg(long, value_name = "outbox|inbox")]
    source: Option<Source>,
}

impl FilterArgs {
    fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            source: self.source,
            consumer: self.consumer.clone(),
            event_type: self.event_type.clone(),
            aggregate_id: self.aggregate.clone(),
            error_contains: self.error.clone(),
        }
    }
}

#[derive(Debug, Args)]
struct Who {
    /// Who does this, for the audit log (default: $USER).
    #[arg(long, value_name = "NAME")]
    actor: Option<String>,
    /// Why, for the audit log.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

impl Who {
    fn actor(&self) -> Actor {
        Actor {
            name: named_or_user(self.actor.clone()),
            reason: self.reason.clone(),
        }
    }
}

/// `name`, else the user running the CLI (`$USER`).
fn named_or_user(name: Option<String>) -> Option<String> {
    name.or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
}

/// The names of the SDK's migrations, in order.
fn sdk_migrations() -> Vec<String> {
    outbox::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// Rows to replay (`outbox:ID`, `inbox:ID`); repeatable.
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Every dead letter, outbox and inbox.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    who: Who,
}

#[derive(Debug, Args)]
struct IgnoreArgs {
    /// Inbox message ids (`inbox:7` or `7`).
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Every dead inbox message.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    who: Who,
}

#[derive(Debug, Args)]
struct ResendArgs {
    /// Event ids (UUIDs).
    #[arg(value_name = "EVENT_ID")]
    event_ids: Vec<EventId>,
    /// Only this event type.
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// Only this aggregate type.
    #[arg(long, value_name = "AGGREGATE_TYPE")]
    aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, value_name = "AGGREGATE_ID")]
    aggregate: Option<String>,
    /// Only events sent at or after this instant (RFC 3339, e.g. 2026-12-03T10:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = instant)]
    sent_after: Option<DateTimeUtc>,
    /// Only events sent before this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = instant)]
    sent_before: Option<DateTimeUtc>,
    #[command(flatten)]
    who: Who,
}

impl ResendArgs {
    fn filter(&self) -> SentFilter {
        let mut filter = SentFilter::default();
        filter.event_type = self.event_type.clone();
        filter.aggregate_type = self.aggregate_type.clone();
        filter.aggregate_id = self.aggregate.clone();
        filter.sent_after = self.sent_after;
        filter.sent_before = self.sent_before;
        filter
    }
}

/// One way of selecting rows, from ids, filters and `--all`.
fn selection(
    ids: Vec<Target>,
    filter: DeadLetterFilter,
    all: bool,
    verb: &str,
) -> Result<Selector, Failure> {
    match (ids.is_empty(), filter.is_empty(), all) {
        (false, true, false) => Ok(Selector::Ids(ids)),
        (true, false, false) => Ok(Selector::Filter(filter)),
        (true, true, true) => Ok(Selector::All),
        (true, true, false) => Err(format!(
            "say what to {verb}: ids, filters (--consumer, --type, --aggregate, --error, \
             --source), or --all"
        )
        .into()),
        _ => Err("choose one way to select: ids, filters, or --all".into()),
    }
}

/// An instant every backend stores (RFC 3339), for clap.
fn instant(text: &str) -> Result<DateTimeUtc, String> {
    let at = text
        .trim()
        .parse::<DateTimeUtc>()
        .map_err(|e| format!("not an RFC 3339 instant ({e}): write e.g. 2026-12-03T10:00:00Z"))?;
    if !bounds::instant_in_range(&at) {
        return Err(format!(
            "out of range: accepted are {}",
            bounds::INSTANT_RANGE
        ));
    }
    Ok(at)
}

/// An age every backend can count back (`7d`, `36h`), for clap.
fn age_arg(text: &str) -> Result<HumanDuration, String> {
    let age = text.parse::<HumanDuration>().map_err(|e| e.to_string())?;
    if age.0 > bounds::MAX_AGE {
        return Err(format!("out of range: accepted are {}", bounds::AGE_RANGE));
    }
    Ok(age)
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// Delete SENT outbox events sent longer ago than this (at most 36500d).
    #[arg(long, default_value = "7d", value_parser = age_arg)]
    sent_after: HumanDuration,
    /// Delete DONE/IGNORED inbox messages processed longer ago than this (the dedup window; at
    /// most 36500d).
    #[arg(long, default_value = "14d", value_parser = age_arg)]
    done_after: HumanDuration,
    /// Refuse a --done-after shorter than this: the broker's redelivery window + the relay's
    /// retry span + how long after the fact you may resend or replay.
    #[arg(long, default_value = "1d", value_parser = age_arg)]
    redelivery_horizon: HumanDuration,
    /// Rows per delete transaction (1 to 100000).
    #[arg(long, default_value_t = 5_000,
        value_parser = clap::value_parser!(u32).range(1..=retention::MAX_BATCH_SIZE as i64))]
    batch_size: u32,
    /// Pause between batches.
    #[arg(long, default_value = "50ms")]
    pause: HumanDuration,
    #[command(flatten)]
    who: Who,
}

/// An error for the user: printed as `error: …`, exit status 1 (2 for a [`Usage`]).
type Failure = Box<dyn std::error::Error>;

/// A command line that cannot be carried out as given (exit status 2, like clap's own errors).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage(error: impl std::fmt::Display) -> Failure {
    Box::new(Usage(error.to_string()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Catalogue { args } = cli.command {
        return outbox::catalogue::cli::run(args);
    }
    init_log(&cli);
    match run(cli).await {
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
        Command::Purge(_) | Command::Migrate => true,
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

/// `outbox serve`: the console on `--listen` until Ctrl-C or SIGTERM.
#[cfg(feature = "console")]
async fn serve(db: DatabaseConnection, database_url: &str, args: ServeArgs) -> Result<(), Failure> {
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
    let console = Console::new(db, auth)
        .doctor_options(DoctorOptions::new(sdk_migrations()).without_handler_check());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let address = listener.local_addr()?;
    tracing::info!(
        url = %format_args!("http://{address}/"),
        database = %redact(database_url),
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
#[cfg(feature = "console")]
async fn stopped() {
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

async fn connect(url: Option<&str>) -> Result<DatabaseConnection, Failure> {
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
fn server_address(url: &str, scheme: &str) -> Option<(String, u16)> {
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
fn redact(url: &str) -> String {
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

/// Print a value as pretty JSON (a macro: the facade has no direct `serde` dependency to name
/// the bound with).
macro_rules! print_json {
    ($value:expr) => {
        println!("{}", serde_json::to_string_pretty($value)?)
    };
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let db = connect(cli.database_url.as_deref()).await?;
    let json = cli.json;
    match cli.command {
        Command::Status => {
            let status = admin::status(&db).await?;
            if json {
                print_json!(&status);
            } else {
                show(&render_status(&status));
            }
        }
        Command::Dead(DeadCommand::List {
            filter,
            limit,
            page,
        }) => {
            let page_spec = Page::number(page.max(1), limit);
            let items = admin::dead_letters(&db, &filter.filter(), page_spec).await?;
            if json {
                print_json!(&items);
            } else {
                show(&render_dead_list(&items, page.max(1), page_spec.limit));
            }
        }
        Command::Dead(DeadCommand::Show { id }) => {
            let target: Target = id.parse()?;
            let detail = admin::dead_letter(&db, target).await?;
            if json {
                print_json!(&detail);
            } else {
                show(&render_detail(&detail));
            }
        }
        Command::Replay(args) => {
            let ids = args
                .ids
                .iter()
                .map(|id| id.parse())
                .collect::<Result<_, _>>()?;
            let selector = selection(ids, args.filter.filter(), args.all, "replay")?;
            let report = admin::replay(&db, &selector, &args.who.actor()).await?;
            return report_action(&report, json, "replayed");
        }
        Command::Ignore(args) => {
            let ids = args
                .ids
                .iter()
                .map(|id| parse_inbox_id(id).map(Target::inbox))
                .collect::<Result<_, _>>()?;
            let selector = selection(ids, args.filter.filter(), args.all, "ignore")?;
            let report = admin::ignore(&db, &selector, &args.who.actor()).await?;
            return report_action(&report, json, "ignored");
        }
        Command::Resend(args) => {
            let filter = args.filter();
            let which = match (args.event_ids.is_empty(), filter.is_empty()) {
                (false, true) => Resend::Events(args.event_ids.clone()),
                (true, false) => Resend::Filter(filter),
                (true, true) => {
                    return Err("say what to resend: event ids, or filters (--type, \
                                --aggregate-type, --aggregate, --sent-after, --sent-before)"
                        .into());
                }
                (false, false) => {
                    return Err("choose one way to select: event ids or filters".into());
                }
            };
            let report = admin::resend(&db, &which, &args.who.actor()).await?;
            return report_action(&report, json, "resent");
        }
        Command::Purge(args) => {
            let policy = RetentionPolicy {
                sent_after: args.sent_after.0,
                done_after: args.done_after.0,
                batch_size: args.batch_size as usize,
                pause: args.pause.0,
                ..RetentionPolicy::default()
            };
            policy.validate(args.redelivery_horizon.0).map_err(usage)?;
            tracing::info!(policy = ?policy, "purge started");
            let report = retention::purge_as(&db, &policy, &args.who.actor()).await?;
            tracing::info!(
                outbox_deleted = report.outbox_deleted,
                inbox_deleted = report.inbox_deleted,
                batches = report.batches,
                "purge finished"
            );
            if json {
                print_json!(&report);
            } else {
                show(&render_purge(&report));
            }
        }
        Command::Doctor => {
            let options = DoctorOptions::new(sdk_migrations()).without_handler_check();
            let report = admin::doctor(&db, &options).await?;
            if json {
                print_json!(&report);
            } else {
                show(&render_doctor(&report));
            }
            if !report.is_healthy() {
                return Ok(ExitCode::from(4));
            }
        }
        Command::Audit { limit } => {
            let actions = admin::audit_log(&db, limit).await?;
            if json {
                print_json!(&actions);
            } else {
                let rows = actions
                    .iter()
                    .map(|a| {
                        vec![
                            a.id.to_string(),
                            a.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                            a.action.clone(),
                            a.rows_affected.to_string(),
                            clip(a.actor.as_deref().unwrap_or("-"), 32),
                            clip(a.reason.as_deref().unwrap_or("-"), 60),
                            clip(&a.target, 80),
                        ]
                    })
                    .collect();
                show(&table(
                    &[
                        "ID", "AT (UTC)", "ACTION", "ROWS", "ACTOR", "REASON", "TARGET",
                    ],
                    rows,
                ));
            }
        }
        #[cfg(feature = "console")]
        Command::Serve(args) => {
            serve(db, cli.database_url.as_deref().unwrap_or_default(), args).await?;
        }
        Command::Migrate => {
            outbox::migrate(&db).await?;
            let names = sdk_migrations();
            if json {
                print_json!(&serde_json::json!({ "applied": names }));
            } else {
                println!(
                    "database up to date: {} SDK migrations applied (latest {})",
                    names.len(),
                    names.last().map(String::as_str).unwrap_or("-")
                );
            }
        }
        // Handled in `main`, before any database is opened.
        Command::Catalogue { args } => return Ok(outbox::catalogue::cli::run(args)),
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_inbox_id(text: &str) -> Result<i64, Failure> {
    if let Ok(id) = text.trim().parse::<i64>() {
        return Ok(id);
    }
    let target: Target = text.parse()?;
    match target.source {
        Source::Inbox => Ok(target.id),
        Source::Outbox => Err(format!(
            "`{text}` is an outbox event: only inbox messages can be ignored \
             (a dead outbox event can be replayed)"
        )
        .into()),
    }
}

fn report_action(report: &ActionReport, json: bool, verb: &str) -> Result<ExitCode, Failure> {
    if json {
        print_json!(report);
    } else {
        println!(
            "{verb} {} row(s): {} outbox, {} inbox (audit #{})",
            report.affected(),
            report.outbox,
            report.inbox,
            report.audit_id
        );
        for skipped in &report.skipped {
            println!("  skipped: {}", printable(&skipped.to_string(), false));
        }
    }
    Ok(if report.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

/// Print human-readable output, every control character but newline and tab escaped (the
/// renderers escape what they put in one line already; this catches the rest).
fn show(text: &str) {
    print!("{}", printable(text, true));
}

/// `text` safe to print on a terminal: control characters (C0 but, with `multi_line`, newline
/// and tab; DEL; C1, whose U+009B starts an escape sequence on some terminals) and the
/// bidirectional formatting characters, which can make text read other than it is, escaped as
/// `\n`, `\x1b`, `\u{202e}`.
fn printable(text: &str, multi_line: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        !(multi_line && matches!(c, '\n' | '\t'))
            && (c.is_control()
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A left-aligned text table with a header row; every cell printed on one line, escaped.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|cell| printable(&cell, false).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// The first line of `text`, escaped and cut to `max` characters; `…` says there is more.
fn clip(text: &str, max: usize) -> String {
    let mut lines = text.trim_start().lines();
    let first = printable(lines.next().unwrap_or_default().trim_end(), false);
    let more = lines.next().is_some();
    if first.chars().count() <= max && !more {
        return first.into_owned();
    }
    let mut cut: String = first.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn age(d: Option<Duration>) -> String {
    d.map(|d| HumanDuration(Duration::from_secs(d.as_secs())).to_string())
        .unwrap_or_else(|| "-".into())
}

fn render_status(status: &Status) -> String {
    let o = &status.outbox;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "OUTBOX  total {}  backlog {}  oldest unsent {}  dead {}  stuck {}",
        o.total,
        o.backlog,
        age(o.oldest_unsent_age),
        o.dead,
        o.stuck
    );
    let statuses = ["PENDING", "PROCESSING", "RETRY", "DEAD", "SENT"];
    let row = statuses
        .iter()
        .map(|s| o.counts.get(*s).copied().unwrap_or(0).to_string())
        .collect();
    out.push_str(&table(&statuses, vec![row]));
    if o.scheduled > 0 {
        let _ = writeln!(
            out,
            "        {} delayed events scheduled (not in the backlog), the next due {}",
            o.scheduled,
            o.next_due_at
                .map_or_else(|| "-".to_owned(), |at| at.to_rfc3339())
        );
    }
    if o.delayed_by_outage > 0 {
        let _ = writeln!(
            out,
            "        {} backlog events wait for the broker: a relay reports it unavailable \
             (no attempt is counted while it is)",
            o.delayed_by_outage
        );
    }
    out.push('\n');
    out.push_str(&render_relays(status));
    out.push('\n');
    if !status.wal_slots.is_empty() {
        out.push_str(&render_wal_slots(status));
        out.push('\n');
    }
    if status.consumers.is_empty() {
        out.push_str("INBOX   no consumer has received anything yet\n");
        return out;
    }
    out.push_str("INBOX\n");
    let statuses = ["PENDING", "PROCESSING", "RETRY", "DEAD", "DONE", "IGNORED"];
    let mut headers = vec!["CONSUMER"];
    headers.extend(statuses);
    headers.extend(["LAG", "STUCK"]);
    let rows = status
        .consumers
        .iter()
        .map(|c| {
            let mut row = vec![c.consumer.clone()];
            row.extend(
                statuses
                    .iter()
                    .map(|s| c.counts.get(*s).copied().unwrap_or(0).to_string()),
            );
            row.push(age(c.lag));
            row.push(c.stuck.to_string());
            row
        })
        .collect();
    out.push_str(&table(&headers, rows));
    out
}

fn render_relays(status: &Status) -> String {
    if status.relays.is_empty() {
        return "RELAYS  none running with a broker\n".to_owned();
    }
    let mut out = String::from("RELAYS\n");
    let headers = [
        "RELAY",
        "TRANSPORT",
        "BROKER",
        "LAST SEEN",
        "UNAVAILABLE FOR",
        "HELD BACK",
        "OUTAGES",
        "LAST ERROR",
    ];
    let rows = status
        .relays
        .iter()
        .map(|r| {
            let broker = match (r.current, r.broker_available) {
                (false, _) => "stopped?",
                (true, true) => "available",
                (true, false) => "UNAVAILABLE",
            };
            vec![
                r.relay_id.clone(),
                r.transport.clone(),
                broker.to_owned(),
                r.broker_seen_ago
                    .map(|d| format!("{} ago", age(Some(d))))
                    .unwrap_or_else(|| "never".into()),
                age(r.unavailable_for),
                r.held_back.to_string(),
                r.outages.to_string(),
                clip(r.last_error.as_deref().unwrap_or("-"), 60),
            ]
        })
        .collect();
    out.push_str(&table(&headers, rows));
    if status.relays.iter().any(|r| !r.current) {
        out.push_str(
            "        stopped?: no report for three heartbeats (the relay was killed, or cannot \
             write to the database)\n",
        );
    }
    out
}

fn render_wal_slots(status: &Status) -> String {
    let mut out = String::from("WAL SLOTS\n");
    let rows = status
        .wal_slots
        .iter()
        .map(|w| {
            vec![
                w.slot.clone(),
                if w.active {
                    "streaming"
                } else {
                    "NOT STREAMING"
                }
                .to_owned(),
                w.wal_status.clone().unwrap_or_else(|| "-".into()),
                bytes(w.lag_bytes),
                bytes(w.retained_bytes),
            ]
        })
        .collect();
    out.push_str(&table(
        &["SLOT", "RELAY", "WAL STATUS", "LAG", "RETAINED"],
        rows,
    ));
    if status.wal_slots.iter().any(|w| !w.active) {
        out.push_str(
            "        NOT STREAMING: no WAL relay reads the slot; the server keeps its WAL until one \
             does (or the slot is dropped)\n",
        );
    }
    out
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn render_dead_list(items: &[DeadLetter], page: u64, limit: u32) -> String {
    if items.is_empty() {
        return if page > 1 {
            format!("no dead letters on page {page}\n")
        } else {
            "no dead letters\n".to_owned()
        };
    }
    let rows = items
        .iter()
        .map(|d| {
            vec![
                d.target.to_string(),
                clip(d.consumer.as_deref().unwrap_or("-"), 32),
                clip(d.event_type.as_deref().unwrap_or("-"), 40),
                clip(d.aggregate_id.as_deref().unwrap_or("-"), 40),
                d.attempts.to_string(),
                d.arrived_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                clip(d.last_error.as_deref().unwrap_or("-"), 80),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "CONSUMER",
            "TYPE",
            "AGGREGATE",
            "ATTEMPTS",
            "ARRIVED (UTC)",
            "LAST ERROR",
        ],
        rows,
    );
    if items.len() as u64 == u64::from(limit) {
        let _ = writeln!(out, "(page {page}; more may follow: --page {})", page + 1);
    }
    out
}

fn render_detail(d: &DeadLetterDetail) -> String {
    let s = &d.summary;
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let ts = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let fields: Vec<(&str, String)> = vec![
        ("id", s.target.to_string()),
        ("status", d.status.clone()),
        ("consumer", opt(&s.consumer)),
        (
            match s.target.source {
                Source::Outbox => "event id",
                Source::Inbox => "message id",
            },
            s.message_id.clone(),
        ),
        ("event type", opt(&s.event_type)),
        ("source", opt(&d.source)),
        (
            "schema version",
            d.schema_version.map_or("-".into(), |v| v.to_string()),
        ),
        ("aggregate type", opt(&s.aggregate_type)),
        ("aggregate id", opt(&s.aggregate_id)),
        (
            "aggregate version",
            d.aggregate_version.map_or("-".into(), |v| v.to_string()),
        ),
        ("dedup key", opt(&d.dedup_key)),
        ("attempts", s.attempts.to_string()),
        ("last error", opt(&s.last_error)),
        (
            match s.target.source {
                Source::Outbox => "created at",
                Source::Inbox => "received at",
            },
            s.arrived_at.to_rfc3339(),
        ),
        (
            "next attempt at",
            ts(d.next_attempt_at.map(|t| t.to_rfc3339())),
        ),
        ("locked by", opt(&d.locked_by)),
        ("locked until", ts(d.locked_until.map(|t| t.to_rfc3339()))),
        ("sent at", ts(d.sent_at.map(|t| t.to_rfc3339()))),
        ("processed at", ts(d.processed_at.map(|t| t.to_rfc3339()))),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in fields {
        // A multi-line value (an error with its causes) continues under its first line.
        let value = printable(&value, true).replace('\n', &format!("\n{:width$}  ", ""));
        let _ = writeln!(out, "{key:<width$}  {value}");
    }
    if !d.failures.is_empty() {
        let _ = writeln!(out, "\nfailures (oldest first):");
        for failure in &d.failures {
            let _ = writeln!(
                out,
                "  {}  attempt {:<3} {:<5}  {}",
                failure.at.to_rfc3339(),
                failure.attempt,
                printable(&failure.status, false),
                printable(&failure.error, true).replace('\n', "\n      ")
            );
        }
    }
    if let Some(headers) = &d.headers {
        let _ = writeln!(out, "\nheaders:\n{}", pretty(headers));
    }
    match (&d.envelope, &d.envelope_error) {
        (Some(envelope), _) => {
            let _ = writeln!(out, "\nenvelope:\n{}", pretty(envelope));
        }
        (None, Some(error)) => {
            let _ = writeln!(out, "\nenvelope: cannot be built: {error}");
        }
        (None, None) => {}
    }
    if d.envelope.is_none() || s.target.source == Source::Outbox {
        let _ = writeln!(out, "\npayload:\n{}", d.payload);
    }
    out
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

fn render_purge(r: &PurgeReport) -> String {
    format!(
        "purged {} outbox event(s) sent before {} and {} inbox message(s) processed before {} \
         in {} batch(es), {:.1}s{}\n",
        r.outbox_deleted,
        r.sent_before.format("%Y-%m-%d %H:%M:%S UTC"),
        r.inbox_deleted,
        r.done_before.format("%Y-%m-%d %H:%M:%S UTC"),
        r.batches,
        r.elapsed.as_secs_f64(),
        r.audit_id
            .map(|id| format!(" (audit #{id})"))
            .unwrap_or_default()
    )
}

fn render_doctor(report: &DoctorReport) -> String {
    let mut out = String::new();
    for f in &report.findings {
        let _ = writeln!(out, "{:<8} {:<11} {}", f.severity, f.check, f.message);
    }
    let errors = report.with_severity(Severity::Error).count();
    let warnings = report.with_severity(Severity::Warning).count();
    let _ = writeln!(
        out,
        "\n{}: {errors} error(s), {warnings} warning(s)",
        if errors == 0 { "healthy" } else { "unhealthy" }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_escaped() {
        let hostile = "a\u{1b}[2Jb\u{1b}]0;t\u{7}\u{9b}1m\u{7f}\u{202e}x\r\n\ty";
        assert_eq!(
            printable(hostile, false),
            "a\\x1b[2Jb\\x1b]0;t\\x07\\x9b1m\\x7f\\u{202e}x\\r\\n\\ty"
        );
        assert_eq!(
            printable(hostile, true),
            "a\\x1b[2Jb\\x1b]0;t\\x07\\x9b1m\\x7f\\u{202e}x\\r\n\ty"
        );
        assert!(matches!(
            printable("plain text, ünïcødé", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn lists_show_the_first_line_cut() {
        assert_eq!(clip("timeout", 10), "timeout");
        assert_eq!(clip("timeout\ncaused by: reset", 10), "timeout…");
        assert_eq!(clip("  \nsecond", 10), "second");
        assert_eq!(clip(&"x".repeat(100_000), 10), "xxxxxxxxx…");
        assert_eq!(clip("\u{1b}[2J", 80), "\\x1b[2J");
    }

    #[test]
    fn table_cells_stay_on_their_line() {
        let text = table(&["A", "B"], vec![vec!["1\n2".into(), "\u{1b}c".into()]]);
        assert_eq!(text, "A     B\n1\\n2  \\x1bc\n");
    }
}
