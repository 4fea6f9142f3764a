//! The console's JSON handlers, each documented in the OpenAPI document by `utoipa::path`.

use std::{str::FromStr, sync::Arc};

use axum::{
    Json,
    extract::{
        DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, State,
        rejection::{JsonRejection, PathRejection, QueryRejection},
    },
    http::StatusCode,
    response::{IntoResponse, Response},
};
use sea_orm::DatabaseConnection;
use serde::{Deserialize, Serialize};
use utoipa::{
    IntoParams, Modify, OpenApi, ToSchema,
    openapi::security::{Http, HttpAuthScheme, SecurityScheme},
};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::{
    Operator,
    samples::{History, Sample},
};
use crate::{
    admin::{
        self, ActionReport, Actor, AdminAction, AdminError, DeadLetter, DeadLetterDetail,
        DeadLetterFilter, DoctorOptions, DoctorReport, FailureGroup, HumanDuration, Page,
        PauseKind, PauseReport, Paused, Resend, Selector, SentFilter, Source, Status, Target,
    },
    retention::{self, PurgeReport, RetentionError, RetentionPolicy},
};

/// Largest request body.
const BODY_LIMIT: usize = 64 * 1024;
/// Most ids in one request.
const MAX_IDS: usize = 1_000;
/// Highest page number of the dead-letter list.
const MAX_PAGE: u64 = 1_000_000;
/// Longest text parameter (a filter, a reason).
const MAX_TEXT_CHARS: usize = 1_000;

/// What the handlers share about one database.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) db: DatabaseConnection,
    pub(super) doctor: DoctorOptions,
    /// Backlog and lag over time.
    pub(super) history: Arc<History>,
}

/// The database a request works on, and what the console keeps for it: chosen from the
/// request's `database` parameter by [`super::set::select`] before the handler runs.
pub(super) struct Db(pub(super) Arc<Shared>);

impl<S: Send + Sync> FromRequestParts<S> for Db {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Arc<Shared>>()
            .cloned()
            .map(Db)
            .ok_or_else(|| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no database selected")
                    .caused_by("the console's database selection did not run")
            })
    }
}

/// An error answer: the HTTP status and what went wrong, for a person to read.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiError {
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong and, where it helps, what to do.
    pub error: String,
    /// What caused a server error, for the service's log only (never in the answer).
    #[serde(skip)]
    cause: Option<String>,
}

/// The cause of a server error, carried in the response's extensions from the handler to the
/// console's request log.
#[derive(Debug, Clone)]
pub(super) struct Cause(pub(super) String);

impl ApiError {
    pub(super) fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            error: error.into(),
            cause: None,
        }
    }

    /// The same answer, with its cause for the log.
    fn caused_by(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }

    pub(super) fn bad_request(error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let cause = self.cause.take();
        let mut response = (status, Json(self)).into_response();
        if let Some(cause) = cause {
            response.extensions_mut().insert(Cause(cause));
        }
        response
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        match &error {
            AdminError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, error.to_string()),
            AdminError::NotMigrated(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the outbox tables are missing or out of date: apply the SDK migrations",
            )
            .caused_by(&error),
            AdminError::Database { doing, .. } => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{doing} failed on the database; the service's log has the details"),
            )
            .caused_by(&error),
            _ => Self::bad_request(error.to_string()),
        }
    }
}

impl From<RetentionError> for ApiError {
    fn from(error: RetentionError) -> Self {
        match error {
            RetentionError::Database(e) => e.into(),
            other => Self::bad_request(other.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        // A body too large (413) or not JSON (415) keeps its status; JSON that does not fit
        // the request is a malformed request like any other (400, not axum's 422).
        let status = match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                rejection.status()
            }
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// A text parameter within bounds, `None` when empty.
fn text(name: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
        Some(v) if v.chars().count() > MAX_TEXT_CHARS => Err(ApiError::bad_request(format!(
            "`{name}` is longer than {MAX_TEXT_CHARS} characters"
        ))),
        // No database stores NUL in text, and no filter or reason needs it.
        Some(v) if v.contains('\0') => Err(ApiError::bad_request(format!(
            "`{name}` contains a NUL character"
        ))),
        other => Ok(other),
    }
}

/// A write's request body, with the actor it is audited under: the authenticated operator and
/// the body's reason (required, but for a pause or a resume).
pub(super) struct Write<T> {
    actor: Actor,
    body: T,
}

/// A write's body, which carries the reason for the audit log.
trait Reasoned {
    /// Whether the write is refused without a reason.
    const REASON_REQUIRED: bool = true;

    fn take_reason(&mut self) -> Option<String>;
}

macro_rules! reasoned {
    ($($request:ty),+) => {$(
        impl Reasoned for $request {
            fn take_reason(&mut self) -> Option<String> {
                self.reason.take()
            }
        }
    )+};
}
reasoned!(ReplayRequest, IgnoreRequest, ResendRequest, PurgeRequest);

impl<S, T> FromRequest<S> for Write<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Reasoned,
{
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        // The authentication layer put it there; without it the route is not reachable.
        let operator = request
            .extensions()
            .get::<Operator>()
            .cloned()
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "authentication required"))?;
        let Json(mut body) = Json::<T>::from_request(request, state).await?;
        let actor = actor(&operator, body.take_reason(), T::REASON_REQUIRED)?;
        Ok(Write { actor, body })
    }
}

/// The actor of a write: the authenticated operator, with the request's reason (refused
/// without one when it is `required`).
fn actor(operator: &Operator, reason: Option<String>, required: bool) -> Result<Actor, ApiError> {
    let actor = Actor::new(operator.0.clone());
    match text("reason", reason)? {
        Some(reason) => Ok(actor.reason(reason)),
        None if required => Err(ApiError::bad_request(
            "a `reason` is required: it is recorded in the audit log",
        )),
        None => Ok(actor),
    }
}

fn ids_within_limit(n: usize) -> Result<(), ApiError> {
    if n > MAX_IDS {
        return Err(ApiError::bad_request(format!(
            "{n} ids in one request; at most {MAX_IDS}"
        )));
    }
    Ok(())
}

/// Filters of the dead-letter list (all optional; combined with AND).
#[derive(Debug, Default, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct FilterParams {
    /// `outbox` or `inbox`.
    source: Option<String>,
    /// The consumer (inbox messages only).
    consumer: Option<String>,
    /// The event type.
    event_type: Option<String>,
    /// The aggregate id.
    aggregate_id: Option<String>,
    /// Text the last error contains.
    error: Option<String>,
}

impl FilterParams {
    fn filter(self) -> Result<DeadLetterFilter, ApiError> {
        let mut filter = DeadLetterFilter::default();
        if let Some(source) = text("source", self.source)? {
            filter = filter.source(Source::from_str(&source).map_err(|_| {
                ApiError::bad_request(format!("`source` is `outbox` or `inbox`, not `{source}`"))
            })?);
        }
        if let Some(v) = text("consumer", self.consumer)? {
            filter = filter.consumer(v);
        }
        if let Some(v) = text("event_type", self.event_type)? {
            filter = filter.event_type(v);
        }
        if let Some(v) = text("aggregate_id", self.aggregate_id)? {
            filter = filter.aggregate_id(v);
        }
        if let Some(v) = text("error", self.error)? {
            filter = filter.error_contains(v);
        }
        Ok(filter)
    }
}

/// One page of the dead-letter list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    /// `outbox` or `inbox`.
    source: Option<String>,
    /// The consumer (inbox messages only).
    consumer: Option<String>,
    /// The event type.
    event_type: Option<String>,
    /// The aggregate id.
    aggregate_id: Option<String>,
    /// Text the last error contains.
    error: Option<String>,
    /// Rows per page, 1 to 1,000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Page number, from 1 (default 1) to 1,000,000.
    #[param(minimum = 1, maximum = 1000000)]
    page: Option<u64>,
}

/// A page of dead letters, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DeadLetterPage {
    /// The page number, from 1.
    page: u64,
    /// Rows per page.
    limit: u32,
    /// The dead letters on this page.
    items: Vec<DeadLetter>,
}

/// Status now: counts per status, the oldest unsent event's age, per-consumer lag and stuck rows,
/// the relays and their brokers, the WAL slots.
#[utoipa::path(get, path = "/api/status", tag = "status",
    responses((status = 200, body = Status), (status = 401, body = ApiError)))]
async fn status(Db(s): Db) -> ApiResult<Status> {
    let status = admin::status(&s.db).await?;
    s.history.record(&status);
    Ok(Json(status))
}

/// Which samples.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct SamplesParams {
    /// Only samples taken at or after this instant (RFC 3339).
    since: Option<chrono::DateTime<chrono::Utc>>,
}

/// Backlog and lag over the last hours, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Samples {
    /// Seconds between two samples.
    interval_secs: u64,
    /// The samples, oldest first.
    samples: Vec<Sample>,
}

/// Backlog, oldest unsent age, and each consumer's backlog and lag, sampled on an interval and
/// kept in memory for the last hours (a restart of the service starts them again).
#[utoipa::path(get, path = "/api/samples", tag = "status", params(SamplesParams),
    responses((status = 200, body = Samples), (status = 400, body = ApiError),
        (status = 401, body = ApiError)))]
async fn samples(
    Db(s): Db,
    params: Result<Query<SamplesParams>, QueryRejection>,
) -> ApiResult<Samples> {
    let Query(p) = params?;
    Ok(Json(Samples {
        interval_secs: s.history.interval.as_secs(),
        samples: s.history.since(p.since),
    }))
}

/// Dead outbox events and inbox messages, newest first.
#[utoipa::path(get, path = "/api/dead-letters", tag = "dead letters", params(ListParams),
    responses((status = 200, body = DeadLetterPage), (status = 400, body = ApiError),
        (status = 401, body = ApiError)))]
async fn dead_letters(
    Db(s): Db,
    params: Result<Query<ListParams>, QueryRejection>,
) -> ApiResult<DeadLetterPage> {
    let Query(p) = params?;
    let limit = p.limit.unwrap_or(50);
    if !(1..=Page::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "`limit` is 1 to {}, not {limit}",
            Page::MAX_LIMIT
        )));
    }
    let page = p.page.unwrap_or(1);
    if !(1..=MAX_PAGE).contains(&page) {
        return Err(ApiError::bad_request(format!(
            "`page` counts from 1 to {MAX_PAGE}, not {page}"
        )));
    }
    let filter = FilterParams {
        source: p.source,
        consumer: p.consumer,
        event_type: p.event_type,
        aggregate_id: p.aggregate_id,
        error: p.error,
    }
    .filter()?;
    let items = admin::dead_letters(&s.db, &filter, Page::number(page, limit)).await?;
    Ok(Json(DeadLetterPage { page, limit, items }))
}

/// Which dead letters to group: every criterion given must hold.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupParams {
    /// `outbox` or `inbox`.
    source: Option<String>,
    /// The consumer (inbox messages only).
    consumer: Option<String>,
    /// The event type.
    event_type: Option<String>,
    /// The aggregate id.
    aggregate_id: Option<String>,
    /// Text the last error contains.
    error: Option<String>,
}

/// Dead letters grouped by error (ids, numbers and quoted values normalised), the largest group
/// first: replay or ignore one with `group` in `/api/replay` or `/api/ignore`.
#[utoipa::path(get, path = "/api/failure-groups", tag = "dead letters", params(GroupParams),
    responses((status = 200, body = Vec<FailureGroup>), (status = 400, body = ApiError),
        (status = 401, body = ApiError)))]
async fn failure_groups(
    Db(s): Db,
    params: Result<Query<GroupParams>, QueryRejection>,
) -> ApiResult<Vec<FailureGroup>> {
    let Query(p) = params?;
    let filter = FilterParams {
        source: p.source,
        consumer: p.consumer,
        event_type: p.event_type,
        aggregate_id: p.aggregate_id,
        error: p.error,
    }
    .filter()?;
    Ok(Json(admin::failure_groups(&s.db, &filter).await?))
}

/// A failure group's fingerprint as given: 16 hexadecimal digits.
fn fingerprint(group: &str) -> Result<&str, ApiError> {
    if group.len() == 16 && group.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(group)
    } else {
        Err(ApiError::bad_request(
            "`group` is a failure group's fingerprint: 16 hexadecimal digits, as \
             /api/failure-groups lists them",
        ))
    }
}

/// One outbox or inbox row in full: envelope, payload, headers, attempts, last error, lease.
#[utoipa::path(get, path = "/api/dead-letters/{id}", tag = "dead letters",
    params(("id" = String, Path, description = "`outbox:12` or `inbox:7`", example = "outbox:12")),
    responses((status = 200, body = DeadLetterDetail), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 404, body = ApiError)))]
async fn dead_letter(
    Db(s): Db,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<DeadLetterDetail> {
    let Path(id) = id?;
    let target: Target = id.parse()?;
    Ok(Json(admin::dead_letter(&s.db, target).await?))
}

/// What to replay: ids, a filter, or every dead letter (exactly one of them).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayRequest {
    /// Rows: `outbox:12`, `inbox:7`.
    #[schema(max_items = 1000)]
    ids: Option<Vec<String>>,
    /// Every dead letter matching this filter (not empty).
    filter: Option<FilterParams>,
    /// Every dead letter, outbox and inbox.
    all: Option<bool>,
    /// Every member of this failure group (its fingerprint).
    group: Option<String>,
    /// Why: recorded in the audit log.
    reason: Option<String>,
}

/// One way of selecting dead letters: ids (parsed by `parse`), a filter, or all of them.
fn selector(
    ids: Option<Vec<String>>,
    filter: Option<FilterParams>,
    all: Option<bool>,
    parse: impl Fn(&str) -> Result<Target, ApiError>,
) -> Result<Selector, ApiError> {
    match (ids, filter, all.unwrap_or(false)) {
        (Some(ids), None, false) => {
            ids_within_limit(ids.len())?;
            let targets = ids
                .iter()
                .map(|id| parse(id))
                .collect::<Result<Vec<_>, _>>()?;
            if targets.is_empty() {
                return Err(ApiError::bad_request("`ids` is empty"));
            }
            Ok(Selector::Ids(targets))
        }
        (None, Some(filter), false) => Ok(Selector::Filter(filter.filter()?)),
        (None, None, true) => Ok(Selector::All),
        _ => Err(ApiError::bad_request(
            "give exactly one of `ids`, `filter` or `all: true`",
        )),
    }
}

/// `group` names the rows on its own.
fn only_group(something_else: bool) -> Result<(), ApiError> {
    if something_else {
        Err(ApiError::bad_request(
            "give exactly one of `ids`, `filter`, `group` or `all: true`",
        ))
    } else {
        Ok(())
    }
}

/// Give dead letters another chance: outbox DEAD → PENDING, inbox DEAD → RETRY due now, with
/// their attempts reset. Rows in another state are reported in `skipped`, not touched.
#[utoipa::path(post, path = "/api/replay", tag = "actions", request_body = ReplayRequest,
    responses((status = 200, body = ActionReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn replay(
    Db(s): Db,
    Write { actor, body: r }: Write<ReplayRequest>,
) -> ApiResult<ActionReport> {
    if let Some(group) = &r.group {
        only_group(r.ids.is_some() || r.filter.is_some() || r.all.is_some())?;
        return Ok(Json(
            admin::replay_group(&s.db, fingerprint(group)?, &actor).await?,
        ));
    }
    let selector = selector(r.ids, r.filter, r.all, |id| Ok(id.parse::<Target>()?))?;
    Ok(Json(admin::replay(&s.db, &selector, &actor).await?))
}

/// Which dead inbox messages to ignore: ids, a filter, or all of them (exactly one).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct IgnoreRequest {
    /// Inbox rows: `inbox:7` (or `7`).
    #[schema(max_items = 1000)]
    ids: Option<Vec<String>>,
    /// Every dead inbox message matching this filter (not empty, not limited to the outbox).
    filter: Option<FilterParams>,
    /// Every dead inbox message.
    all: Option<bool>,
    /// Every member of this inbox failure group (its fingerprint).
    group: Option<String>,
    /// Why: recorded in the audit log.
    reason: Option<String>,
}

/// Decide not to handle dead inbox messages: DEAD → IGNORED. They no longer hold their aggregate
/// back. Rows in another state are reported in `skipped`, not touched.
#[utoipa::path(post, path = "/api/ignore", tag = "actions", request_body = IgnoreRequest,
    responses((status = 200, body = ActionReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn ignore(
    Db(s): Db,
    Write { actor, body: r }: Write<IgnoreRequest>,
) -> ApiResult<ActionReport> {
    if let Some(group) = &r.group {
        only_group(r.ids.is_some() || r.filter.is_some() || r.all.is_some())?;
        return Ok(Json(
            admin::ignore_group(&s.db, fingerprint(group)?, &actor).await?,
        ));
    }
    let selector = selector(r.ids, r.filter, r.all, |id| {
        let target = match id.trim().parse::<i64>() {
            Ok(n) => Target::inbox(n),
            Err(_) => id.parse::<Target>()?,
        };
        if target.source != Source::Inbox {
            return Err(ApiError::bad_request(format!(
                "ignore applies to inbox rows only; {target} is not one"
            )));
        }
        Ok(target)
    })?;
    Ok(Json(admin::ignore(&s.db, &selector, &actor).await?))
}

/// Which SENT outbox events to resend (all criteria given must hold; at least one).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SentFilterParams {
    /// The event type.
    event_type: Option<String>,
    /// The aggregate type.
    aggregate_type: Option<String>,
    /// The aggregate id.
    aggregate_id: Option<String>,
    /// Only events sent at or after this instant (RFC 3339).
    sent_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only events sent before this instant (RFC 3339).
    sent_before: Option<chrono::DateTime<chrono::Utc>>,
}

impl SentFilterParams {
    fn filter(self) -> Result<SentFilter, ApiError> {
        let mut filter = SentFilter::default();
        if let Some(v) = text("event_type", self.event_type)? {
            filter = filter.event_type(v);
        }
        if let Some(v) = text("aggregate_type", self.aggregate_type)? {
            filter = filter.aggregate_type(v);
        }
        if let Some(v) = text("aggregate_id", self.aggregate_id)? {
            filter = filter.aggregate_id(v);
        }
        if let Some(at) = self.sent_after {
            filter = filter.sent_after(at);
        }
        if let Some(at) = self.sent_before {
            filter = filter.sent_before(at);
        }
        Ok(filter)
    }
}

/// SENT outbox events to publish again: event ids or a filter (exactly one).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ResendRequest {
    /// The event ids.
    #[schema(max_items = 1000)]
    event_ids: Option<Vec<Uuid>>,
    /// Every SENT event matching this filter (not empty).
    filter: Option<SentFilterParams>,
    /// Why: recorded in the audit log.
    reason: Option<String>,
}

/// Publish SENT outbox events again (SENT → PENDING), under the same event ids: consumers that
/// still hold them in their inbox suppress them as duplicates. Events in another state are
/// reported in `skipped`, not touched.
#[utoipa::path(post, path = "/api/resend", tag = "actions", request_body = ResendRequest,
    responses((status = 200, body = ActionReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn resend(
    Db(s): Db,
    Write { actor, body: r }: Write<ResendRequest>,
) -> ApiResult<ActionReport> {
    let which = match (r.event_ids, r.filter) {
        (Some(ids), None) => {
            ids_within_limit(ids.len())?;
            if ids.is_empty() {
                return Err(ApiError::bad_request("`event_ids` is empty"));
            }
            Resend::Events(ids)
        }
        (None, Some(filter)) => Resend::Filter(filter.filter()?),
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `event_ids` or `filter`",
            ));
        }
    };
    Ok(Json(admin::resend(&s.db, &which, &actor).await?))
}

/// What to purge.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PurgeRequest {
    /// Delete SENT outbox events sent longer ago than this (default `7d`).
    #[schema(example = "7d")]
    sent_after: Option<String>,
    /// Delete DONE and IGNORED inbox messages processed longer ago than this (default `14d`):
    /// the inbox's deduplication window.
    #[schema(example = "14d")]
    done_after: Option<String>,
    /// Refuse a `done_after` shorter than this (default `1d`): the broker's redelivery window,
    /// the relay's retry span and how long after the fact events may be resent or replayed.
    #[schema(example = "1d")]
    redelivery_horizon: Option<String>,
    /// Why: recorded in the audit log.
    reason: Option<String>,
}

fn duration(name: &str, value: Option<String>, default: &str) -> Result<HumanDuration, ApiError> {
    let value = text(name, value)?.unwrap_or_else(|| default.to_owned());
    value
        .parse::<HumanDuration>()
        .map_err(|e| ApiError::bad_request(format!("`{name}`: {e}")))
}

/// Delete finished rows now, as the retention janitor does (never DEAD or unfinished rows).
#[utoipa::path(post, path = "/api/purge", tag = "actions", request_body = PurgeRequest,
    responses((status = 200, body = PurgeReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn purge(Db(s): Db, Write { actor, body: r }: Write<PurgeRequest>) -> ApiResult<PurgeReport> {
    let policy = RetentionPolicy::default()
        .sent_after(duration("sent_after", r.sent_after, "7d")?.0)
        .done_after(duration("done_after", r.done_after, "14d")?.0);
    let horizon = duration("redelivery_horizon", r.redelivery_horizon, "1d")?.0;
    policy.validate(horizon)?;
    Ok(Json(retention::purge_as(&s.db, &policy, &actor).await?))
}

/// Is the database ready for the SDK, and is anything stuck?
#[utoipa::path(get, path = "/api/doctor", tag = "status",
    responses((status = 200, body = DoctorReport), (status = 401, body = ApiError)))]
async fn doctor(Db(s): Db) -> ApiResult<DoctorReport> {
    Ok(Json(admin::doctor(&s.db, &s.doctor).await?))
}

/// How much of the audit log.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditParams {
    /// The newest this many actions, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// Every admin action, newest first: what, which rows, how many, who, why, when.
#[utoipa::path(get, path = "/api/audit", tag = "status", params(AuditParams),
    responses((status = 200, body = Vec<AdminAction>), (status = 400, body = ApiError),
        (status = 401, body = ApiError)))]
async fn audit(
    Db(s): Db,
    params: Result<Query<AuditParams>, QueryRejection>,
) -> ApiResult<Vec<AdminAction>> {
    let Query(p) = params?;
    let limit = p.limit.unwrap_or(100);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "`limit` is 1 to 1000, not {limit}"
        )));
    }
    Ok(Json(admin::audit_log(&s.db, limit).await?))
}

/// Every pause in force, consumers first, by name: who paused it, since when, why.
#[utoipa::path(get, path = "/api/pauses", tag = "pauses",
    responses((status = 200, body = Vec<Paused>), (status = 401, body = ApiError)))]
async fn pauses(Db(s): Db) -> ApiResult<Vec<Paused>> {
    Ok(Json(admin::pauses(&s.db).await?))
}

/// A consumer or a destination, to pause or resume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseRequest {
    /// `consumer` or `destination`.
    kind: PauseKind,
    /// The consumer's name, or the destination's: the subject, topic, routing key or stream
    /// its events are published to (the event type for the database-local transport).
    #[schema(min_length = 1, max_length = 255)]
    name: String,
    /// Why (optional): recorded in the audit log, and shown with the pause.
    reason: Option<String>,
}

impl Reasoned for PauseRequest {
    const REASON_REQUIRED: bool = false;

    fn take_reason(&mut self) -> Option<String> {
        self.reason.take()
    }
}

impl PauseRequest {
    /// The name, refused when blank (the admin API checks its length and characters).
    fn name(&self) -> Result<&str, ApiError> {
        if self.name.trim().is_empty() {
            return Err(ApiError::bad_request(
                "`name` is empty: give the consumer's or the destination's name",
            ));
        }
        Ok(&self.name)
    }
}

/// Pause a consumer (it takes no message: deliveries wait in the broker, stored ones stay
/// PENDING or RETRY) or a destination (nothing is published to it: its events stay PENDING, no
/// attempt spent). Every service honours it within a few seconds. Pausing what is paused
/// already changes nothing (`changed: false`); both are audited.
#[utoipa::path(post, path = "/api/pause", tag = "pauses", request_body = PauseRequest,
    responses((status = 200, body = PauseReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn pause(Db(s): Db, Write { actor, body: r }: Write<PauseRequest>) -> ApiResult<PauseReport> {
    Ok(Json(admin::pause(&s.db, r.kind, r.name()?, &actor).await?))
}

/// Resume a paused consumer or destination: every service takes it up again within a few
/// seconds. Resuming what is not paused changes nothing (`changed: false`); both are audited.
#[utoipa::path(post, path = "/api/resume", tag = "pauses", request_body = PauseRequest,
    responses((status = 200, body = PauseReport), (status = 400, body = ApiError),
        (status = 401, body = ApiError), (status = 403, body = ApiError)))]
async fn resume(
    Db(s): Db,
    Write { actor, body: r }: Write<PauseRequest>,
) -> ApiResult<PauseReport> {
    Ok(Json(admin::resume(&s.db, r.kind, r.name()?, &actor).await?))
}

/// The OpenAPI document.
pub(super) async fn openapi_json(State(openapi): State<Arc<String>>) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        openapi.as_ref().clone(),
    )
        .into_response()
}

#[derive(OpenApi)]
#[openapi(
    info(title = "outbox console", description = "The outbox SDK's operator API."),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct Doc;

/// Declares the bearer scheme every route requires.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The documented routes of one database (chosen by the request's `database` parameter).
pub(super) fn routes() -> OpenApiRouter {
    OpenApiRouter::with_openapi(Doc::openapi())
        .routes(routes!(status))
        .routes(routes!(samples))
        .routes(routes!(dead_letters))
        .routes(routes!(dead_letter))
        .routes(routes!(failure_groups))
        .routes(routes!(replay))
        .routes(routes!(ignore))
        .routes(routes!(resend))
        .routes(routes!(purge))
        .routes(routes!(doctor))
        .routes(routes!(audit))
        .routes(routes!(pauses))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}
