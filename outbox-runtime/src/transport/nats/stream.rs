//! The JetStream stream of the namespace: its configuration, and creating it or bringing an
//! existing one in line with the settings.

use async_nats::jetstream::{
    ErrorCode,
    context::{CreateStreamErrorKind, GetStreamErrorKind},
    stream,
};

use super::{NatsTransport, TRANSPORT};
use crate::transport::TransportError;

/// Why setting the stream up failed.
enum StreamSetup {
    /// The server could not create the stream's store: worth asking again.
    StoreFailed(TransportError),
    Failed(TransportError),
}

impl From<TransportError> for StreamSetup {
    fn from(error: TransportError) -> Self {
        StreamSetup::Failed(error)
    }
}

/// Times setup asks again after the server failed to create the stream's store (a server-side
/// error, code 500, that the next request usually does not hit).
const STORE_FAILURE_RETRIES: u32 = 3;

impl NatsTransport {
    /// [`Transport::setup`](crate::transport::Transport::setup): gets or creates the stream.
    pub(super) async fn ensure_stream(&self) -> Result<(), TransportError> {
        let mut tries = 0;
        loop {
            match self.get_or_create_stream().await {
                Err(StreamSetup::StoreFailed(e)) if tries < STORE_FAILURE_RETRIES => {
                    tries += 1;
                    tracing::warn!(stream = %self.inner.stream_name, error = %e, "the server could not create the stream's store; asking again");
                    tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(tries)))
                        .await;
                }
                Err(StreamSetup::StoreFailed(e) | StreamSetup::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    async fn get_or_create_stream(&self) -> Result<(), StreamSetup> {
        let js = &self.inner.jetstream;
        let name = &self.inner.stream_name;
        match js.get_stream(name).await {
            Ok(stream) => {
                self.set_clustered(stream.cached_info().cluster.is_some());
                return Ok(self
                    .reconcile_stream(stream.cached_info().config.clone())
                    .await?);
            }
            Err(err) => match err.kind() {
                GetStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                _ => {
                    return Err(TransportError::new(
                        TRANSPORT,
                        format!("cannot look up stream `{name}`: {err}"),
                    )
                    .into());
                }
            },
        }
        match js.create_stream(self.stream_config()).await {
            Ok(stream) => {
                self.set_clustered(stream.cached_info().cluster.is_some());
                tracing::info!(stream = %name, subjects = %self.stream_subject(), "created the stream");
                Ok(())
            }
            Err(err) => match err.kind() {
                // Another instance created it in the meantime.
                CreateStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NAME_EXIST =>
                {
                    let stream = js.get_stream(name).await.map_err(|err| {
                        TransportError::new(
                            TRANSPORT,
                            format!("cannot look up stream `{name}`: {err}"),
                        )
                    })?;
                    Ok(self
                        .reconcile_stream(stream.cached_info().config.clone())
                        .await?)
                }
                CreateStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP =>
                {
                    Err(TransportError::new(
                        TRANSPORT,
                        format!(
                            "cannot create stream `{name}`: its subjects `{}` overlap those of \
                             another stream ({api}); set `stream_name` to that stream or use \
                             another namespace",
                            self.stream_subject()
                        ),
                    )
                    .into())
                }
                CreateStreamErrorKind::JetStream(api) if api.code() == 500 => {
                    Err(StreamSetup::StoreFailed(TransportError::new(
                        TRANSPORT,
                        format!("cannot create stream `{name}`: {err}"),
                    )))
                }
                _ => Err(TransportError::new(
                    TRANSPORT,
                    format!("cannot create stream `{name}`: {err}"),
                )
                .into()),
            },
        }
    }

    pub(super) fn stream_subject(&self) -> String {
        format!("{}.>", self.inner.config.namespace)
    }

    fn stream_config(&self) -> stream::Config {
        let config = &self.inner.config;
        stream::Config {
            name: self.inner.stream_name.clone(),
            description: Some(format!(
                "outbox events published under `{}.>`",
                config.namespace
            )),
            subjects: vec![self.stream_subject()],
            duplicate_window: config.effective_duplicate_window(),
            max_age: config.max_age.unwrap_or_default(),
            retention: config.retention,
            storage: config.storage,
            num_replicas: config.replicas.unwrap_or(0),
            ..Default::default()
        }
    }

    /// Checks an existing stream against the configuration: fails when it stores other
    /// subjects, brings the duplicate window, max age and (when set) replicas in line when they
    /// differ.
    async fn reconcile_stream(&self, existing: stream::Config) -> Result<(), TransportError> {
        let wanted = self.stream_subject();
        if existing.subjects != [wanted.as_str()] {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "stream `{}` exists with subjects {:?}, not [\"{wanted}\"]: it belongs to \
                     something else; choose another stream name or namespace",
                    existing.name, existing.subjects
                ),
            ));
        }
        let config = &self.inner.config;
        let max_age = config.max_age.unwrap_or_default();
        let duplicate_window = config.effective_duplicate_window();
        if existing.storage != config.storage || existing.retention != config.retention {
            tracing::warn!(
                stream = %existing.name,
                existing_storage = ?existing.storage,
                existing_retention = ?existing.retention,
                wanted_storage = ?config.storage,
                wanted_retention = ?config.retention,
                "the stream's storage or retention differs from the configuration; \
                 JetStream cannot change them in place, keeping the stream as it is"
            );
        }
        // The server reports one copy as 1 (or 0 from some versions): both mean one.
        let replicas = config.replicas.unwrap_or(existing.num_replicas.max(1));
        if existing.duplicate_window != duplicate_window
            || existing.max_age != max_age
            || existing.num_replicas.max(1) != replicas
        {
            tracing::info!(
                stream = %existing.name,
                ?duplicate_window,
                ?max_age,
                replicas,
                "updating the stream's duplicate window, max age and replicas"
            );
            let name = existing.name.clone();
            let updated = stream::Config {
                duplicate_window,
                max_age,
                num_replicas: replicas,
                ..existing
            };
            self.inner
                .jetstream
                .update_stream(updated)
                .await
                .map_err(|err| {
                    TransportError::new(
                        TRANSPORT,
                        format!("cannot update the settings of stream `{name}`: {err}"),
                    )
                })?;
        }
        Ok(())
    }
}
