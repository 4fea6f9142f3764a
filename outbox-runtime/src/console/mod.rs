//! The operator console's REST API (feature `console`): the [`admin`](crate::admin) operations
//! as JSON over HTTP, for a service to mount in its own axum server.
//!
//! ```no_run
//! # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_runtime::console::{Console, ConsoleAuth};
//!
//! let token = std::env::var("OUTBOX_CONSOLE_TOKEN")?;
//! let console = Console::new(db, ConsoleAuth::bearer("ops", token)?);
//! let app = axum::Router::new().nest("/outbox", console.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! **Routes** (all under the router's mount point; `GET /api/openapi.json` is the contract):
//!
//! | method and path | what |
//! |---|---|
//! | `GET /api/databases` | over a set: every database's owner (`UNOWNED` when nobody holds it), pending events and the oldest's age, dead rows, inbox backlog, error |
//! | `GET /api/status` | counts per status, oldest unsent age, per-consumer lag, stuck rows, relays, WAL slots |
//! | `GET /api/samples` | backlog and lag over the last hours, sampled on an interval and kept in memory |
//! | `GET /api/dead-letters` | dead letters, newest first: `source`, `consumer`, `event_type`, `aggregate_id`, `error`, `limit`, `page` |
//! | `GET /api/dead-letters/{id}` | one row in full (`outbox:12`, `inbox:7`): envelope, payload, attempts, last error |
//! | `POST /api/replay` | dead letters by id, by filter or all: outbox DEAD → PENDING, inbox DEAD → RETRY |
//! | `POST /api/ignore` | inbox DEAD → IGNORED |
//! | `POST /api/resend` | a SENT outbox event → PENDING |
//! | `POST /api/purge` | the retention purge, now |
//! | `GET /api/doctor` | tables, indexes, migrations, stuck rows |
//! | `GET /api/audit` | the audit log, newest first |
//! | `GET /api/pauses` | the consumers and destinations paused, who paused them, since when, why |
//! | `POST /api/pause` | pause a consumer (it takes no message) or a destination (nothing is published to it) |
//! | `POST /api/resume` | resume a paused consumer or destination |
//!
//! **A set of databases.** [`Console::for_set`] serves one console over the databases of a
//! [`fleet`](crate::fleet) (a database per tenant): every route but `/api/databases` then takes
//! a `database` query parameter naming the database it works on (`/api/dead-letters?database=acme`),
//! and answers 400 without one, 404 for a name the set does not hold. A write acts on that
//! database only, and is audited in it. With [`Console::control`] the list shows each database's
//! owner; the page shows a database selector and the set's overview, the unowned highlighted.
//!
//! ```no_run
//! # async fn f(control: sea_orm::DatabaseConnection, acme: sea_orm::DatabaseConnection,
//! #     globex: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_runtime::{console::{Console, ConsoleAuth}, fleet::FleetDatabase};
//!
//! let auth = ConsoleAuth::bearer("ops", std::env::var("OUTBOX_CONSOLE_TOKEN")?)?;
//! let databases = vec![FleetDatabase::new("acme", acme), FleetDatabase::new("globex", globex)];
//! let console = Console::for_set(databases, auth).control(control, "order-service");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! console.serve(listener, std::future::pending()).await?;
//! # Ok(()) }
//! ```
//!
//! Every write is the admin API's: guarded by the row's expected status (a row in another state
//! is reported in `skipped`, not touched), requires a `reason` (optional for a pause or a
//! resume), and is recorded in the audit table with the authenticated operator as its actor.
//!
//! **Security.** Every route, the OpenAPI document included, answers 401 without an
//! authenticated operator ([`ConsoleAuth`]): a bearer token from the service's configuration, or
//! an [`Operator`] that the service's own tower layer puts into the request's extensions.
//! Writes are refused (403) when the browser says the request comes from another site
//! (`Sec-Fetch-Site`, or an `Origin` that is not the request's `Host`), and take JSON only, which
//! an HTML form cannot send. Request bodies are limited to 64 KiB, lists to 1,000 ids, texts to
//! 1,000 characters. Database errors are logged and answered without their details; tokens are
//! never logged. Binding the listener to anything but loopback is the service's choice. Every
//! answer of the API, errors included, says `Cache-Control: no-store` and
//! `X-Content-Type-Options: nosniff`: dead letters and the audit trail must not be kept by a
//! browser or a proxy.
//!
//! **Log.** Every request is logged (`tracing`, target `outbox_runtime::console`) when it is
//! answered: method, path, status, time taken and, once authenticated, the operator (and over a
//! set, the database); at `INFO`,
//! and at `ERROR` with its cause for a 5xx.

mod api;
mod auth;
mod log;
mod page;
mod samples;
mod set;

use std::{collections::HashMap, sync::Arc, time::Duration};

use sea_orm::DatabaseConnection;
use utoipa_axum::router::OpenApiRouter;

use crate::{admin::DoctorOptions, fleet::FleetDatabase};
pub use api::ApiError;
pub use auth::{ConsoleAuth, ConsoleAuthError, Operator};

/// The router [`Console::router`] builds: an `axum::Router`, to serve or to nest in the
/// service's own.
pub type ConsoleRouter = axum::Router;

/// The console's configuration; [`Console::router`] builds its axum router.
#[derive(Debug, Clone)]
pub struct Console {
    serves: Serves,
    auth: ConsoleAuth,
    doctor: DoctorOptions,
    sample_interval: Duration,
    history: Duration,
}

/// What a console serves.
#[derive(Debug, Clone)]
enum Serves {
    One(DatabaseConnection),
    Set {
        databases: Vec<FleetDatabase>,
        /// The fleet's control database and group.
        control: Option<(DatabaseConnection, String)>,
    },
}

impl Console {
    /// A console over `db`, authenticated by `auth`. `doctor` checks the tables only until
    /// [`Console::doctor_options`] names the migrations to expect.
    pub fn new(db: DatabaseConnection, auth: ConsoleAuth) -> Self {
        Self::serving(Serves::One(db), auth)
    }

    /// A console over a set of databases (a fleet's): `GET /api/databases` lists them, every
    /// other route works on the one its `database` query parameter names. A name given twice
    /// is served once (the first).
    pub fn for_set(databases: Vec<FleetDatabase>, auth: ConsoleAuth) -> Self {
        Self::serving(
            Serves::Set {
                databases,
                control: None,
            },
            auth,
        )
    }

    /// Where the set's owners are kept: the fleet's control database and its `group` (the
    /// service's CloudEvents source unless it set `group(…)`). Without it the owners are not
    /// shown; a console over one database has none to show.
    pub fn control(mut self, control: DatabaseConnection, group: impl Into<String>) -> Self {
        if let Serves::Set { control: c, .. } = &mut self.serves {
            *c = Some((control, group.into()));
        }
        self
    }

    fn serving(serves: Serves, auth: ConsoleAuth) -> Self {
        Console {
            serves,
            auth,
            doctor: DoctorOptions::new(Vec::<String>::new()).without_handler_check(),
            sample_interval: Duration::from_secs(30),
            history: Duration::from_secs(6 * 3_600),
        }
    }

    /// How often the charts' samples are taken (default 30 s; at least 1 s), and how long they
    /// are kept (default 6 hours).
    pub fn samples(mut self, interval: Duration, keep: Duration) -> Self {
        self.sample_interval = interval;
        self.history = keep;
        self
    }

    /// What `GET /api/doctor` checks (the migrations to expect, the consumers).
    pub fn doctor_options(mut self, options: DoctorOptions) -> Self {
        self.doctor = options;
        self
    }

    /// The router: the page at `/` and the API under `/api`, behind the authentication layer.
    ///
    /// Called within a tokio runtime, it also starts the sampler behind the charts, which
    /// stops once the router and its clones are dropped.
    pub fn router(self) -> ConsoleRouter {
        let runtime = tokio::runtime::Handle::try_current().ok();
        // One history of samples a database, each with its sampler.
        let shared = |db: &DatabaseConnection| {
            let history = Arc::new(samples::History::new(self.sample_interval, self.history));
            if let Some(runtime) = &runtime {
                runtime.spawn(samples::run(db.clone(), Arc::downgrade(&history)));
            }
            Arc::new(api::Shared {
                db: db.clone(),
                doctor: self.doctor.clone(),
                history,
            })
        };
        let (selection, listed) = match &self.serves {
            Serves::One(db) => (
                set::Selection::One(shared(db)),
                set::Listed {
                    databases: Vec::new(),
                    control: None,
                },
            ),
            Serves::Set { databases, control } => {
                let mut by_name = HashMap::with_capacity(databases.len());
                for database in databases {
                    if !by_name.contains_key(database.name()) {
                        by_name.insert(database.name().to_owned(), shared(database.connection()));
                    }
                }
                (
                    set::Selection::Set(by_name),
                    set::Listed {
                        databases: databases.clone(),
                        control: control.clone(),
                    },
                )
            }
        };
        let per_database = api::routes().route_layer(axum::middleware::from_fn_with_state(
            Arc::new(selection),
            set::select,
        ));
        let (router, openapi) = documented(per_database);
        let api = router.layer(axum::Extension(Arc::new(listed))).route(
            "/api/openapi.json",
            axum::routing::get(api::openapi_json)
                .with_state(Arc::new(openapi.to_json().unwrap_or_default())),
        );
        let api = auth::guard(api, Arc::new(self.auth))
            .layer(axum::middleware::map_response(log::private_answer));
        page::routes()
            .merge(api)
            .layer(axum::middleware::from_fn(log::request))
    }

    /// Serve the console on `listener` until `shutdown` completes, then finish the requests in
    /// flight.
    pub async fn serve<F>(
        self,
        listener: tokio::net::TcpListener,
        shutdown: F,
    ) -> std::io::Result<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// The OpenAPI document the router serves at `/api/openapi.json`.
    pub fn openapi() -> utoipa::openapi::OpenApi {
        documented(api::routes()).1
    }
}

/// The routes of one database with the set's, and their OpenAPI document.
fn documented(per_database: OpenApiRouter) -> (axum::Router, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = per_database.merge(set::routes()).split_for_parts();
    set::document(&mut openapi);
    (router, openapi)
}

/// [`Console::new`] then [`Console::router`].
pub fn router(db: DatabaseConnection, auth: ConsoleAuth) -> ConsoleRouter {
    Console::new(db, auth).router()
}
