//! A set of databases from a file (`--databases FILE`, one `name = url` a line): `--database
//! NAME` picks one of them for any command, `migrate --all` and `status --all` run over all of
//! them, and `serve` without `--database` serves one console over all of them. URLs are never
//! printed but with their password masked; errors about a line name the line, not its text.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use outbox::{
    fleet::{self, DatabaseStatus, FleetDatabase, Ownership},
    sea_orm::DatabaseConnection,
};

use crate::{
    Failure,
    args::StatusArgs,
    commands::sdk_migrations,
    connect,
    render::{self, clip, printable, show},
    usage,
};

/// How many names an error about an unknown one lists.
const NAMES_SHOWN: usize = 20;

/// One database of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) url: String,
    /// Where it is in the file (from 1).
    line: usize,
}

/// What the command line says about where the database (or the set) is.
#[derive(Debug)]
pub(crate) struct Given<'a> {
    /// `--database-url` or `DATABASE_URL`.
    pub(crate) url: Option<&'a str>,
    /// The URL was on the command line, not from `DATABASE_URL`.
    pub(crate) url_on_command_line: bool,
    /// `--databases FILE` or `OUTBOX_DATABASES`.
    pub(crate) file: Option<&'a PathBuf>,
    /// `--database NAME`.
    pub(crate) name: Option<&'a str>,
}

impl Given<'_> {
    /// The URL of the one database a command works on.
    pub(crate) fn one(&self) -> Result<Option<String>, Failure> {
        match (self.name, self.file) {
            (Some(_), _) if self.url_on_command_line => Err(usage(
                "--database NAME picks a database of the --databases file, and --database-url \
                 names one by its URL: give one of them",
            )),
            (Some(_), None) => Err(usage(
                "--database NAME picks a database of a --databases FILE (or OUTBOX_DATABASES): \
                 give the file too, or name the database with --database-url",
            )),
            (Some(name), Some(file)) => {
                let entries = load(file)?;
                Ok(Some(pick(&entries, name, file)?.url.clone()))
            }
            (None, Some(file)) if self.url.is_none() => {
                let entries = load(file)?;
                Err(usage(format!(
                    "no database picked: --database NAME picks one of {}: {} (`migrate --all` \
                     and `status --all` run over all of them)",
                    file.display(),
                    known(&entries)
                )))
            }
            (None, _) => Ok(self.url.map(str::to_owned)),
        }
    }

    /// Every database of the file when `serve` is to serve the whole set: `--databases FILE`
    /// without `--database NAME`.
    #[cfg(feature = "console")]
    pub(crate) fn set_to_serve(&self) -> Result<Option<Vec<Entry>>, Failure> {
        match (self.file, self.name) {
            (Some(_), None) if self.url_on_command_line => Err(usage(
                "`serve` serves the set of --databases FILE, or the one database of \
                 --database-url: give one of them",
            )),
            (Some(file), None) => load(file).map(Some),
            _ => Ok(None),
        }
    }

    /// Every database of the file, for `command --all`.
    pub(crate) fn all(&self, command: &str) -> Result<Vec<Entry>, Failure> {
        if self.name.is_some() {
            return Err(usage(format!(
                "`{command} --all` runs over every database of the --databases file: drop \
                 --database NAME, or drop --all to work on that one"
            )));
        }
        if self.url_on_command_line {
            return Err(usage(format!(
                "`{command} --all` runs over the databases of --databases FILE: drop \
                 --database-url"
            )));
        }
        let file = self.file.ok_or_else(|| {
            usage(format!(
                "`{command} --all` needs the set of databases: --databases FILE (or \
                 OUTBOX_DATABASES), one `name = url` a line"
            ))
        })?;
        load(file)
    }
}

/// The databases of the file at `path`.
pub(crate) fn load(path: &Path) -> Result<Vec<Entry>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the databases file {}: {e}", path.display()))?;
    parse(&path.display().to_string(), &text)
}

/// One `name = url` a line (the name is what comes before the first `=`); blank lines and
/// lines starting with `#` are skipped. Names are checked as the fleet checks them, each once.
pub(crate) fn parse(file: &str, text: &str) -> Result<Vec<Entry>, Failure> {
    let mut entries: Vec<Entry> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        // The line's text is never shown: it may hold a password.
        let malformed = || {
            usage(format!(
                "{file}:{line}: expected `name = url`, the URL with its scheme \
                 (postgres://…, mysql://…, sqlite://…)"
            ))
        };
        let (name, url) = trimmed.split_once('=').ok_or_else(malformed)?;
        let (name, url) = (name.trim(), url.trim());
        if name.contains("://") || !has_scheme(url) {
            return Err(malformed());
        }
        fleet::check_database_name(name).map_err(|e| usage(format!("{file}:{line}: {e}")))?;
        if let Some(first) = entries.iter().find(|e| e.name == name) {
            return Err(usage(format!(
                "{file}:{line}: database `{name}` is named twice (first on line {})",
                first.line
            )));
        }
        entries.push(Entry {
            name: name.to_owned(),
            url: url.to_owned(),
            line,
        });
    }
    if entries.is_empty() {
        return Err(usage(format!(
            "{file} names no database: write one `name = url` a line"
        )));
    }
    Ok(entries)
}

/// `scheme:…`, as every database URL starts.
fn has_scheme(url: &str) -> bool {
    url.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// The entry `name`; an error lists the names there are.
fn pick<'e>(entries: &'e [Entry], name: &str, file: &Path) -> Result<&'e Entry, Failure> {
    entries.iter().find(|e| e.name == name).ok_or_else(|| {
        usage(format!(
            "no database `{}` in {}: it names {}",
            clip(name, fleet::MAX_DATABASE_NAME_CHARS),
            file.display(),
            known(entries)
        ))
    })
}

/// The first names of the file, and how many more there are.
fn known(entries: &[Entry]) -> String {
    let mut names: Vec<String> = entries
        .iter()
        .take(NAMES_SHOWN)
        .map(|e| format!("`{}`", e.name))
        .collect();
    if entries.len() > NAMES_SHOWN {
        names.push(format!("and {} more", entries.len() - NAMES_SHOWN));
    }
    names.join(", ")
}

/// Each database connected; one that cannot be joins the set unconnected (the fleet's
/// functions report it), with why (its URL's password masked) to report instead.
pub(crate) async fn connect_each(entries: &[Entry]) -> (Vec<FleetDatabase>, Vec<Option<String>>) {
    let mut databases = Vec::with_capacity(entries.len());
    let mut failed = Vec::with_capacity(entries.len());
    for entry in entries {
        match connect::connect(Some(&entry.url)).await {
            Ok(db) => {
                databases.push(FleetDatabase::new(entry.name.clone(), db));
                failed.push(None);
            }
            Err(e) => {
                tracing::warn!(database = %entry.name, error = %e, "the database is left out");
                databases.push(FleetDatabase::new(
                    entry.name.clone(),
                    DatabaseConnection::default(),
                ));
                failed.push(Some(e.to_string()));
            }
        }
    }
    (databases, failed)
}

/// `migrate --all`: every database, one line each; exit status 1 when any failed.
pub(crate) async fn migrate_all(entries: &[Entry], json: bool) -> Result<ExitCode, Failure> {
    let (databases, failed) = connect_each(entries).await;
    let mut report = fleet::migrate_all(&databases).await;
    for (migrated, why) in report.iter_mut().zip(failed) {
        if let Some(why) = why {
            migrated.result = Err(why);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let applied = sdk_migrations().len();
        let lines: Vec<(String, String)> = report
            .iter()
            .map(|m| {
                let outcome = match &m.result {
                    Ok(()) => format!("ok: {applied} SDK migrations applied"),
                    Err(e) => format!("error: {}", clip(e, 400)),
                };
                (printable(&m.database, false).into_owned(), outcome)
            })
            .collect();
        let width = lines.iter().map(|(n, _)| n.chars().count()).max();
        for (name, outcome) in &lines {
            let pad = width.unwrap_or(0) - name.chars().count();
            println!("{name}{}  {outcome}", " ".repeat(pad));
        }
    }
    let failures = report.iter().filter(|m| m.result.is_err()).count();
    if failures == 0 {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "error: {failures} of {} databases not migrated",
        report.len()
    );
    Ok(ExitCode::FAILURE)
}

/// `status --all`: a row a database; exit status 5 when one is unowned or cannot be read.
pub(crate) async fn status_all(
    entries: &[Entry],
    args: &StatusArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let control = control(
        args.owners.control_url.as_deref(),
        args.owners.group.as_deref(),
    )
    .await?;
    let (control, group) = match &control {
        Some((db, group)) => (Some(db), group.as_str()),
        None => (None, ""),
    };
    let (databases, failed) = connect_each(entries).await;
    let mut rows = fleet::status(control, group, &databases).await;
    for (row, why) in rows.iter_mut().zip(failed) {
        if let Some(why) = why {
            row.figures = Err(why);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        show(&render_status(&rows));
    }
    Ok(if rows.iter().any(DatabaseStatus::needs_attention) {
        ExitCode::from(5)
    } else {
        ExitCode::SUCCESS
    })
}

/// The fleet's control database (connected) and group, from `--control-url` and `--group`:
/// both or neither.
pub(crate) async fn control(
    url: Option<&str>,
    group: Option<&str>,
) -> Result<Option<(DatabaseConnection, String)>, Failure> {
    match (url, group) {
        (Some(_), None) => Err(usage(
            "--control-url needs --group NAME (or OUTBOX_FLEET_GROUP): the fleet's group, \
             which is the service's CloudEvents source unless it set `group(…)`",
        )),
        (None, Some(_)) => Err(usage(
            "--group names a fleet in a control database: give --control-url too",
        )),
        (None, None) => Ok(None),
        (Some(url), Some(group)) => {
            let db = connect::connect(Some(url))
                .await
                .map_err(|e| format!("the control database: {e}"))?;
            Ok(Some((db, group.to_owned())))
        }
    }
}

/// A row a database, then what needs attention.
fn render_status(rows: &[DatabaseStatus]) -> String {
    let mut unowned = 0;
    let mut unreadable = 0;
    let table = rows
        .iter()
        .map(|row| {
            let note = match (&row.figures, &row.ownership) {
                (Err(e), _) => {
                    unreadable += 1;
                    clip(e, 200)
                }
                (Ok(_), Ownership::Unknown { error }) => {
                    unreadable += 1;
                    clip(error, 200)
                }
                _ => String::new(),
            };
            if matches!(row.ownership, Ownership::Unowned { .. }) {
                unowned += 1;
            }
            let figures = match &row.figures {
                Ok(f) => vec![
                    f.pending.to_string(),
                    render::age(f.oldest_pending_age),
                    f.dead.to_string(),
                    f.inbox_backlog.to_string(),
                ],
                Err(_) => vec!["?".to_owned(); 4],
            };
            let mut cells = vec![row.database.clone(), row.ownership.to_string()];
            cells.extend(figures);
            cells.push(note);
            cells
        })
        .collect();
    let mut out = render::table(
        &[
            "DATABASE",
            "OWNER",
            "PENDING",
            "OLDEST PENDING",
            "DEAD",
            "INBOX BACKLOG",
            "PROBLEM",
        ],
        table,
    );
    let owners_asked = rows
        .iter()
        .any(|r| !matches!(r.ownership, Ownership::NotAsked));
    out.push_str(&format!(
        "{} database(s): {unowned} unowned, {unreadable} unreadable{}\n",
        rows.len(),
        if owners_asked {
            ""
        } else {
            " (owners not asked: give --control-url and --group)"
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_name_equals_url_with_comments_and_blanks() {
        let text = "# tenants\n\nacme = postgres://u:pw@db1/acme?sslmode=require\n  \
                    globex=sqlite://g.db?mode=rwc  \n";
        let entries = parse("set.conf", text).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "acme");
        assert_eq!(entries[0].url, "postgres://u:pw@db1/acme?sslmode=require");
        assert_eq!((entries[1].name.as_str(), entries[1].line), ("globex", 4));
    }

    #[test]
    fn bad_lines_are_named_by_number_never_shown() {
        for (text, line) in [
            ("a = sqlite://a.db\npostgres://u:secret@h/db\n", 2),
            (
                "a = sqlite://a.db\n\npostgres://u:secret@h/db?sslmode=require\n",
                3,
            ),
            ("a =\n", 1),
            (" = postgres://u:secret@h/db\n", 1),
            ("a = sqlite://a.db\na = postgres://u:secret@h/db\n", 2),
        ] {
            let error = parse("set.conf", text).unwrap_err();
            assert!(error.is::<crate::Usage>());
            let error = error.to_string();
            assert!(error.starts_with(&format!("set.conf:{line}: ")), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        assert!(parse("set.conf", "# nothing\n").is_err());
    }

    #[test]
    fn an_unknown_name_lists_the_first_names() {
        let text: String = (0..25)
            .map(|i| format!("t{i} = sqlite://t{i}.db\n"))
            .collect();
        let entries = parse("set.conf", &text).unwrap();
        let error = pick(&entries, "nope", Path::new("set.conf"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("`t0`") && error.contains("`t19`"), "{error}");
        assert!(
            !error.contains("`t20`") && error.contains("and 5 more"),
            "{error}"
        );
    }
}
