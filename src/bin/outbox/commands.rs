//! One function a command: call the admin API, then print JSON or the human-readable rendering.

use std::process::ExitCode;

use outbox::{
    admin::{self, ActionReport, DoctorOptions, Page, Resend, Target},
    retention::{self, RetentionPolicy},
    sea_orm::DatabaseConnection,
};
use serde::Serialize;

use crate::{
    Failure,
    args::{
        FilterArgs, IgnoreArgs, PauseArgs, PauseTarget, PurgeArgs, ReplayArgs, ResendArgs,
        parse_inbox_id, selection,
    },
    render::{self, printable, show},
    usage,
};

/// The result of a command: its exit status, or the error to print.
type Outcome = Result<ExitCode, Failure>;

/// Print `value` as pretty JSON, or as `render` shows it.
fn emit<T: Serialize>(json: bool, value: &T, render: impl FnOnce(&T) -> String) -> Outcome {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        show(&render(value));
    }
    Ok(ExitCode::SUCCESS)
}

/// The names of the SDK's migrations, in order.
pub(crate) fn sdk_migrations() -> Vec<String> {
    outbox::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

pub(crate) async fn status(db: &DatabaseConnection, json: bool) -> Outcome {
    emit(json, &admin::status(db).await?, render::render_status)
}

pub(crate) async fn dead_list(
    db: &DatabaseConnection,
    json: bool,
    filter: &FilterArgs,
    limit: u32,
    page: u64,
) -> Outcome {
    let page = page.max(1);
    let spec = Page::number(page, limit);
    let items = admin::dead_letters(db, &filter.filter(), spec).await?;
    emit(json, &items, |items| {
        render::render_dead_list(items, page, spec.limit)
    })
}

pub(crate) async fn dead_groups(
    db: &DatabaseConnection,
    json: bool,
    filter: &FilterArgs,
) -> Outcome {
    let groups = admin::failure_groups(db, &filter.filter()).await?;
    emit(json, &groups, |groups| render::render_groups(groups))
}

/// The failure group an action names with `--group`, when it names one and nothing else.
fn group_only(rest: &crate::args::Selecting, ids: usize) -> Result<Option<&str>, Failure> {
    match &rest.group {
        None => Ok(None),
        Some(_) if ids > 0 || !rest.filter.filter().is_empty() || rest.all => {
            Err("choose one way to select: ids, filters, --group, or --all".into())
        }
        Some(group) => Ok(Some(group)),
    }
}

pub(crate) async fn dead_show(db: &DatabaseConnection, json: bool, id: &str) -> Outcome {
    let target: Target = id.parse()?;
    emit(
        json,
        &admin::dead_letter(db, target).await?,
        render::render_detail,
    )
}

pub(crate) async fn replay(db: &DatabaseConnection, json: bool, args: &ReplayArgs) -> Outcome {
    let ids = args
        .ids
        .iter()
        .map(|id| id.parse())
        .collect::<Result<Vec<Target>, _>>()?;
    if let Some(group) = group_only(&args.rest, ids.len())? {
        let report = admin::replay_group(db, group, &args.rest.who.actor()).await?;
        return report_action(&report, json, "replayed");
    }
    let selector = selection(ids, args.rest.filter.filter(), args.rest.all, "replay")?;
    let report = admin::replay(db, &selector, &args.rest.who.actor()).await?;
    report_action(&report, json, "replayed")
}

pub(crate) async fn ignore(db: &DatabaseConnection, json: bool, args: &IgnoreArgs) -> Outcome {
    let ids = args
        .ids
        .iter()
        .map(|id| parse_inbox_id(id).map(Target::inbox))
        .collect::<Result<Vec<Target>, _>>()?;
    if let Some(group) = group_only(&args.rest, ids.len())? {
        let report = admin::ignore_group(db, group, &args.rest.who.actor()).await?;
        return report_action(&report, json, "ignored");
    }
    let selector = selection(ids, args.rest.filter.filter(), args.rest.all, "ignore")?;
    let report = admin::ignore(db, &selector, &args.rest.who.actor()).await?;
    report_action(&report, json, "ignored")
}

pub(crate) async fn resend(db: &DatabaseConnection, json: bool, args: &ResendArgs) -> Outcome {
    let filter = args.filter();
    let which = match (args.event_ids.is_empty(), filter.is_empty()) {
        (false, true) => Resend::Events(args.event_ids.clone()),
        (true, false) => Resend::Filter(filter),
        (true, true) => {
            return Err("say what to resend: event ids, or filters (--type, \
                        --aggregate-type, --aggregate, --sent-after, --sent-before)"
                .into());
        }
        (false, false) => return Err("choose one way to select: event ids or filters".into()),
    };
    let report = admin::resend(db, &which, &args.who.actor()).await?;
    report_action(&report, json, "resent")
}

pub(crate) async fn purge(db: &DatabaseConnection, json: bool, args: &PurgeArgs) -> Outcome {
    let policy = RetentionPolicy::default()
        .sent_after(args.sent_after.0)
        .done_after(args.done_after.0)
        .batch_size(args.batch_size as usize)
        .pause(args.pause.0);
    policy.validate(args.redelivery_horizon.0).map_err(usage)?;
    tracing::info!(policy = ?policy, "purge started");
    let report = retention::purge_as(db, &policy, &args.who.actor()).await?;
    tracing::info!(
        outbox_deleted = report.outbox_deleted,
        inbox_deleted = report.inbox_deleted,
        batches = report.batches,
        slots_emptied = report.slots_emptied,
        "purge finished"
    );
    emit(json, &report, render::render_purge)
}

pub(crate) async fn doctor(db: &DatabaseConnection, json: bool) -> Outcome {
    let options = DoctorOptions::new(sdk_migrations()).without_handler_check();
    let report = admin::doctor(db, &options).await?;
    emit(json, &report, render::render_doctor)?;
    Ok(if report.is_healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

pub(crate) async fn audit(db: &DatabaseConnection, json: bool, limit: u32) -> Outcome {
    let actions = admin::audit_log(db, limit).await?;
    emit(json, &actions, |actions| render::render_audit(actions))
}

pub(crate) async fn migrate(db: &DatabaseConnection, json: bool) -> Outcome {
    outbox::migrate(db).await?;
    let names = sdk_migrations();
    emit(json, &serde_json::json!({ "applied": names }), |_| {
        format!(
            "database up to date: {} SDK migrations applied (latest {})\n",
            names.len(),
            names.last().map(String::as_str).unwrap_or("-")
        )
    })
}

/// What an action did; exit status 3 when it left some of the rows asked for unchanged.
fn report_action(report: &ActionReport, json: bool, verb: &str) -> Outcome {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
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

/// `pause` (with `pausing`) or `resume`.
pub(crate) async fn pause(
    db: &DatabaseConnection,
    json: bool,
    args: &PauseArgs,
    pausing: bool,
) -> Outcome {
    let kind = match args.kind {
        PauseTarget::Consumer => admin::PauseKind::Consumer,
        PauseTarget::Destination => admin::PauseKind::Destination,
    };
    let actor = args.who.actor();
    let report = if pausing {
        admin::pause(db, kind, &args.name, &actor).await?
    } else {
        admin::resume(db, kind, &args.name, &actor).await?
    };
    emit(json, &report, render::render_pause)
}

pub(crate) async fn pauses(db: &DatabaseConnection, json: bool) -> Outcome {
    emit(json, &admin::pauses(db).await?, |p| {
        render::render_pauses(p)
    })
}
