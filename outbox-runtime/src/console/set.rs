//! One console over a set of databases (a database per tenant, as `outbox::fleet` serves them):
//! `GET /api/databases` lists every database with its owner and figures, and every other route
//! works on the database its `database` query parameter names.
//!
//! The parameter is taken off the request before the handler runs (so the handlers' own
//! parameters are what they always were) and checked: 1 to
//! [`MAX_DATABASE_NAME_CHARS`](crate::fleet::MAX_DATABASE_NAME_CHARS) characters without control
//! characters, given once (400 otherwise), one of the set's names (404 otherwise). A console over
//! one database takes no `database` parameter; a console over a set takes no request without
//! one.

use std::{collections::HashMap, sync::Arc};

use axum::{
    Extension, Json,
    extract::{Query, Request, State},
    http::{StatusCode, Uri, uri::PathAndQuery},
    middleware::Next,
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use utoipa::{
    ToSchema,
    openapi::{
        ContentBuilder, OpenApi, Ref, RefOr, Required, ResponseBuilder,
        path::{ParameterBuilder, ParameterIn},
        schema::{ObjectBuilder, Type},
    },
};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::api::{ApiError, Shared};
use crate::{
    fleet::{self, FleetDatabase, MAX_DATABASE_NAME_CHARS, Ownership},
    util::text::truncate,
};

/// The query parameter naming the database.
const PARAMETER: &str = "database";

/// Which database each request works on.
#[derive(Debug)]
pub(super) enum Selection {
    /// The console serves one database: no request names one.
    One(Arc<Shared>),
    /// The console serves a set: every request names one of them.
    Set(HashMap<String, Arc<Shared>>),
}

/// The database a request worked on, for the request log.
#[derive(Debug, Clone)]
pub(super) struct Selected(pub(super) String);

/// Take the `database` parameter off the request and put the database it names into the
/// request's extensions, where the handlers' [`Db`](super::api::Db) finds it.
pub(super) async fn select(
    State(selection): State<Arc<Selection>>,
    mut request: Request,
    next: Next,
) -> Response {
    let name = match take_parameter(request.uri_mut()) {
        Ok(name) => name,
        Err(error) => return error.into_response(),
    };
    let shared = match (selection.as_ref(), &name) {
        (Selection::One(shared), None) => shared.clone(),
        (Selection::One(_), Some(name)) => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no database `{}`: this console serves one database, drop `{PARAMETER}`",
                    truncate(name, MAX_DATABASE_NAME_CHARS)
                ),
            )
            .into_response();
        }
        (Selection::Set(set), None) => {
            return ApiError::bad_request(format!(
                "this console serves {} databases: name one with `?{PARAMETER}=NAME` \
                 (GET /api/databases lists them)",
                set.len()
            ))
            .into_response();
        }
        (Selection::Set(set), Some(name)) => match set.get(name) {
            Some(shared) => shared.clone(),
            None => {
                return ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no database `{}` in this console's set (GET /api/databases lists them)",
                        truncate(name, MAX_DATABASE_NAME_CHARS)
                    ),
                )
                .into_response();
            }
        },
    };
    request.extensions_mut().insert(shared);
    let mut response = next.run(request).await;
    if let Some(name) = name {
        response.extensions_mut().insert(Selected(name));
    }
    response
}

/// The `database` parameter's value, checked, and the URI without it.
fn take_parameter(uri: &mut Uri) -> Result<Option<String>, ApiError> {
    let Some(query) = uri.query() else {
        return Ok(None);
    };
    let mut found: Option<String> = None;
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match decoded(pair) {
            Some((key, value)) if key == PARAMETER => {
                if found.is_some() {
                    return Err(ApiError::bad_request(format!(
                        "`{PARAMETER}` is given more than once"
                    )));
                }
                check(&value)?;
                found = Some(value);
            }
            _ => kept.push(pair),
        }
    }
    if found.is_none() {
        return Ok(None);
    }
    let path = uri.path();
    let rest = if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(
        rest.parse::<PathAndQuery>()
            .map_err(|_| ApiError::bad_request("the query string cannot be read"))?,
    );
    *uri = Uri::from_parts(parts)
        .map_err(|_| ApiError::bad_request("the query string cannot be read"))?;
    Ok(found)
}

/// One `key=value` pair of a query string, percent-decoded as the handlers' own parameters are.
fn decoded(pair: &str) -> Option<(String, String)> {
    let uri: Uri = format!("/?{pair}").parse().ok()?;
    Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .ok()?
        .0
        .into_iter()
        .next()
}

/// A database name as the fleet takes them.
fn check(name: &str) -> Result<(), ApiError> {
    fleet::check_database_name(name).map_err(|_| {
        ApiError::bad_request(format!(
            "`{PARAMETER}` names a database: 1 to {MAX_DATABASE_NAME_CHARS} characters, not blank, \
             without control characters"
        ))
    })
}

/// What `GET /api/databases` reads: the set, and where its owners are kept.
#[derive(Debug)]
pub(super) struct Listed {
    pub(super) databases: Vec<FleetDatabase>,
    /// The fleet's control database and group, when owners are shown.
    pub(super) control: Option<(DatabaseConnection, String)>,
}

/// One database of the set: its owner and its figures (or why it could not be read).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DatabaseRow {
    /// The database's name: the `database` parameter of the other routes.
    database: String,
    /// Who holds its lease.
    owner: Ownership,
    /// Outbox events not yet sent (PENDING, PROCESSING and RETRY).
    pending: Option<u64>,
    /// When the oldest of them was enqueued.
    oldest_pending_at: Option<DateTime<Utc>>,
    /// How long it has waited, in seconds, by the database's clock.
    oldest_pending_age_secs: Option<f64>,
    /// DEAD rows, outbox and inbox.
    dead: Option<u64>,
    /// Inbox messages not yet handled, all consumers.
    inbox_backlog: Option<u64>,
    /// Why the database could not be read.
    error: Option<String>,
    /// Nobody owns it, its owner could not be read, or it could not be read itself.
    needs_attention: bool,
}

impl DatabaseRow {
    fn of(status: fleet::DatabaseStatus) -> Self {
        let needs_attention = status.needs_attention();
        let owner = status.ownership;
        let (figures, error) = match status.figures {
            Ok(figures) => (Some(figures), None),
            Err(error) => (None, Some(error)),
        };
        DatabaseRow {
            database: status.database,
            owner,
            pending: figures.as_ref().map(|f| f.pending),
            oldest_pending_at: figures.as_ref().and_then(|f| f.oldest_pending_at),
            oldest_pending_age_secs: figures
                .as_ref()
                .and_then(|f| f.oldest_pending_age)
                .map(|d| d.as_secs_f64()),
            dead: figures.as_ref().map(|f| f.dead),
            inbox_backlog: figures.as_ref().map(|f| f.inbox_backlog),
            error,
            needs_attention,
        }
    }
}

/// Every database this console serves, in the order it was given: its owner (with a control
/// database: `owned`, `unowned`, `unknown`), pending events and the age of the oldest, dead rows,
/// inbox backlog, or why it could not be read. A database nobody owns needs attention: its
/// events wait until an instance takes it. A console over one database lists none.
#[utoipa::path(get, path = "/api/databases", tag = "databases",
    responses((status = 200, body = Vec<DatabaseRow>), (status = 401, body = ApiError)))]
async fn databases(Extension(listed): Extension<Arc<Listed>>) -> Json<Vec<DatabaseRow>> {
    let (control, group) = match &listed.control {
        Some((db, group)) => (Some(db), group.as_str()),
        None => (None, ""),
    };
    let rows = fleet::status(control, group, &listed.databases).await;
    Json(rows.into_iter().map(DatabaseRow::of).collect())
}

/// The set's documented route (its [`Listed`] given as an extension).
pub(super) fn routes() -> OpenApiRouter {
    OpenApiRouter::new().routes(routes!(databases))
}

/// Documents the `database` parameter on every route but `/api/databases`, and the 400 and 404
/// it is answered with.
pub(super) fn document(openapi: &mut OpenApi) {
    let parameter = ParameterBuilder::new()
        .name(PARAMETER)
        .parameter_in(ParameterIn::Query)
        .required(Required::False)
        .description(Some(
            "The database of the console's set to work on (`GET /api/databases` lists them); \
             required when the console serves a set, refused when it serves one database.",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(MAX_DATABASE_NAME_CHARS)),
        ))
        .build();
    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ApiError")))
                        .build(),
                )
                .build(),
        )
    };
    for (path, item) in openapi.paths.paths.iter_mut() {
        if path == "/api/databases" {
            continue;
        }
        for operation in [&mut item.get, &mut item.post].into_iter().flatten() {
            operation
                .parameters
                .get_or_insert_with(Vec::new)
                .push(parameter.clone());
            let responses = &mut operation.responses.responses;
            responses
                .entry("400".into())
                .or_insert_with(|| error("Bad request: a malformed parameter or body"));
            responses
                .entry("404".into())
                .or_insert_with(|| error("Not found: no such database (or row)"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(uri: &str) -> (Result<Option<String>, u16>, String) {
        let mut uri: Uri = uri.parse().unwrap();
        let taken = take_parameter(&mut uri).map_err(|e| e.status);
        (taken, uri.to_string())
    }

    #[test]
    fn the_database_parameter_is_taken_off_the_query() {
        assert_eq!(take("/api/status"), (Ok(None), "/api/status".into()));
        assert_eq!(
            take("/api/status?database=acme"),
            (Ok(Some("acme".into())), "/api/status".into())
        );
        assert_eq!(
            take("/api/dead-letters?limit=5&database=t%C3%A9nant+1&page=2"),
            (
                Ok(Some("ténant 1".into())),
                "/api/dead-letters?limit=5&page=2".into()
            )
        );
        assert_eq!(
            take("/api/dead-letters?limit=5"),
            (Ok(None), "/api/dead-letters?limit=5".into())
        );
        for bad in [
            "/api/status?database=",
            "/api/status?database=%20",
            "/api/status?database=a%0Ab",
            "/api/status?database=a&database=b",
        ] {
            assert_eq!(take(bad).0, Err(400), "{bad}");
        }
        let long = format!("/api/status?database={}", "a".repeat(129));
        assert_eq!(take(&long).0, Err(400));
        let longest = format!("/api/status?database={}", "a".repeat(128));
        assert!(take(&longest).0.is_ok());
    }
}
