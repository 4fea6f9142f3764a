//! The command line's arguments, and the checks clap runs on them.

use clap::{Args, Subcommand};
use outbox::{
    EventId,
    admin::{Actor, DeadLetterFilter, HumanDuration, Selector, SentFilter, Source, Target, bounds},
    retention,
    sea_orm::prelude::DateTimeUtc,
};

use crate::Failure;

#[cfg(feature = "console")]
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on. Anything but a loopback address also needs --public.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Accept a --listen address that is not loopback: the console is then reachable from the
    /// network (put TLS in front of it).
    #[arg(long)]
    pub(crate) public: bool,
    /// Who the token acts as, in the audit log (default: $USER).
    #[arg(long, value_name = "NAME")]
    pub(crate) operator: Option<String>,
    /// A file holding the console token (at least 16 characters); else OUTBOX_CONSOLE_TOKEN.
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// Serving the set of --databases FILE: where its owners are read.
    #[command(flatten)]
    pub(crate) owners: OwnersArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
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
    /// Dead letters grouped by error (ids, numbers and quoted values normalised), the largest
    /// group first: replay or ignore one with `--group FINGERPRINT`.
    Groups {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// One row in full: envelope, payload, attempts, last error, timestamps.
    Show {
        /// `outbox:ID` or `inbox:ID`, as `dead list` shows.
        id: String,
    },
}

#[derive(Debug, Args, Default)]
pub(crate) struct FilterArgs {
    /// Only this consumer's inbox messages.
    #[arg(long)]
    pub(crate) consumer: Option<String>,
    /// Only this event type.
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, value_name = "AGGREGATE_ID")]
    pub(crate) aggregate: Option<String>,
    /// Only rows whose last error contains this text (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub(crate) error: Option<String>,
    /// Only the outbox or only the inbox.
    #[arg(long, value_name = "outbox|inbox")]
    pub(crate) source: Option<Source>,
}

impl FilterArgs {
    pub(crate) fn filter(&self) -> DeadLetterFilter {
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
pub(crate) struct Who {
    /// Who does this, for the audit log (default: $USER).
    #[arg(long, value_name = "NAME")]
    pub(crate) actor: Option<String>,
    /// Why, for the audit log.
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
}

impl Who {
    pub(crate) fn actor(&self) -> Actor {
        Actor {
            name: named_or_user(self.actor.clone()),
            reason: self.reason.clone(),
        }
    }
}

/// `name`, else the user running the CLI (`$USER`).
pub(crate) fn named_or_user(name: Option<String>) -> Option<String> {
    name.or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
}

/// What `pause` and `resume` apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PauseTarget {
    /// A consumer, by name (`#[inbox_handler(consumer = "…")]`).
    Consumer,
    /// A destination: the subject, topic, routing key or stream events are published to (the
    /// event type for the database-local transport).
    Destination,
}

#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// `consumer` or `destination`.
    #[arg(value_enum)]
    pub(crate) kind: PauseTarget,
    /// Its name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) who: Who,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Rows to replay (`outbox:ID`, `inbox:ID`); repeatable.
    #[arg(long = "id", value_name = "ID")]
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) rest: Selecting,
}

/// What an action on dead letters takes beside ids, and who takes it.
#[derive(Debug, Args)]
pub(crate) struct Selecting {
    /// Every member of this failure group (its fingerprint, as `dead groups` shows it).
    #[arg(long, value_name = "FINGERPRINT")]
    pub(crate) group: Option<String>,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
    /// Every dead letter the action applies to (replay: outbox and inbox; ignore: inbox).
    #[arg(long)]
    pub(crate) all: bool,
    #[command(flatten)]
    pub(crate) who: Who,
}

#[derive(Debug, Args)]
pub(crate) struct IgnoreArgs {
    /// Inbox message ids (`inbox:7` or `7`).
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) rest: Selecting,
}

#[derive(Debug, Args)]
pub(crate) struct ResendArgs {
    /// Event ids (UUIDs).
    #[arg(value_name = "EVENT_ID")]
    pub(crate) event_ids: Vec<EventId>,
    /// Only this event type.
    #[arg(long = "type", value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
    /// Only this aggregate type.
    #[arg(long, value_name = "AGGREGATE_TYPE")]
    pub(crate) aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, value_name = "AGGREGATE_ID")]
    pub(crate) aggregate: Option<String>,
    /// Only events sent at or after this instant (RFC 3339, e.g. 2026-12-03T10:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = instant)]
    pub(crate) sent_after: Option<DateTimeUtc>,
    /// Only events sent before this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = instant)]
    pub(crate) sent_before: Option<DateTimeUtc>,
    #[command(flatten)]
    pub(crate) who: Who,
}

impl ResendArgs {
    pub(crate) fn filter(&self) -> SentFilter {
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
pub(crate) fn selection(
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
pub(crate) fn instant(text: &str) -> Result<DateTimeUtc, String> {
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
pub(crate) fn age_arg(text: &str) -> Result<HumanDuration, String> {
    let age = text.parse::<HumanDuration>().map_err(|e| e.to_string())?;
    if age.0 > bounds::MAX_AGE {
        return Err(format!("out of range: accepted are {}", bounds::AGE_RANGE));
    }
    Ok(age)
}

#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Delete SENT outbox events sent longer ago than this (at most 36500d).
    #[arg(long, default_value = "7d", value_parser = age_arg)]
    pub(crate) sent_after: HumanDuration,
    /// Delete DONE/IGNORED inbox messages processed longer ago than this (the dedup window; at
    /// most 36500d).
    #[arg(long, default_value = "14d", value_parser = age_arg)]
    pub(crate) done_after: HumanDuration,
    /// Refuse a --done-after shorter than this: the broker's redelivery window + the relay's
    /// retry span + how long after the fact you may resend or replay.
    #[arg(long, default_value = "1d", value_parser = age_arg)]
    pub(crate) redelivery_horizon: HumanDuration,
    /// Rows per delete transaction (1 to 100000).
    #[arg(long, default_value_t = 5_000,
        value_parser = clap::value_parser!(u32).range(1..=retention::MAX_BATCH_SIZE as i64))]
    pub(crate) batch_size: u32,
    /// Pause between batches.
    #[arg(long, default_value = "50ms")]
    pub(crate) pause: HumanDuration,
    #[command(flatten)]
    pub(crate) who: Who,
}

/// An inbox row id for `ignore`: `7` or `inbox:7`.
pub(crate) fn parse_inbox_id(text: &str) -> Result<i64, Failure> {
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

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Every database of --databases FILE, one row each: owner, pending events and the age of
    /// the oldest, dead rows, inbox backlog. Exit status 5 when a database is unowned or cannot
    /// be read.
    #[arg(long)]
    pub(crate) all: bool,
    /// With --all: where the owners are read.
    #[command(flatten)]
    pub(crate) owners: OwnersArgs,
}

/// Where the owners of a set's databases are read: the fleet's control database and group.
#[derive(Debug, Args)]
pub(crate) struct OwnersArgs {
    /// The fleet's control database, where the owners' leases are kept (without it the owners
    /// are not shown).
    #[arg(
        long,
        env = "OUTBOX_CONTROL_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) control_url: Option<String>,
    /// With --control-url: the fleet's group, which is the service's CloudEvents source unless
    /// it set `group(…)`. Required with --control-url: the control database keeps only digests
    /// of group names, so there is none to guess.
    #[arg(long, env = "OUTBOX_FLEET_GROUP", value_name = "NAME")]
    pub(crate) group: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Every database of --databases FILE, going on past one that fails; one line each. Exit
    /// status 1 when any failed.
    #[arg(long)]
    pub(crate) all: bool,
}
