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
//! answered: method, path, status, time taken and, once authenticated, the operator; at `INFO`,
//! and at `ERROR` with its cause for a 5xx.

mod api;
mod auth;
mod log;
mod page;
mod samples;

use std::{sync::Arc, time::Duration};

use sea_orm::DatabaseConnection;

use crate::admin::DoctorOptions;
pub use api::ApiError;
pub use auth::{ConsoleAuth, ConsoleAuthError, Operator};

/// The router [`Console::router`] builds: an `axum::Router`, to serve or to nest in the
/// service's own.
pub type ConsoleRouter = axum::Router;

/// The console's configuration; [`Console::router`] builds its axum router.
#[derive(Debug, Clone)]
pub struct Console {
    db: DatabaseConnection,
    auth: ConsoleAuth,
    doctor: DoctorOptions,
    sample_interval: Duration,
    history: Duration,
}

impl Console {
    /// A console over `db`, authenticated by `auth`. `doctor` checks the tables only until
    /// [`Console::doctor_options`] names the migrations to expect.
    pub fn new(db: DatabaseConnection, auth: ConsoleAuth) -> Self {
        Console {
            db,
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
        let (router, openapi) = api::routes().split_for_parts();
        let history = Arc::new(samples::History::new(self.sample_interval, self.history));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(samples::run(self.db.clone(), Arc::downgrade(&history)));
        }
        let state = Arc::new(api::Shared {
            db: self.db,
            doctor: self.doctor,
            openapi: Arc::new(openapi.to_json().unwrap_or_default()),
            history,
        });
        let api = router
            .route("/api/openapi.json", axum::routing::get(api::openapi_json))
            .with_state(state);
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
        api::openapi()
    }
}

/// [`Console::new`] then [`Console::router`].
pub fn router(db: DatabaseConnection, auth: ConsoleAuth) -> ConsoleRouter {
    Console::new(db, auth).router()
}
