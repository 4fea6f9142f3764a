//! NATS test support: a transport on a fresh namespace whose stream is deleted afterwards.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use super::{connect_or_skip, fresh_namespace};
use outbox::transport::nats::{NatsTransport, NatsTransportBuilder, async_nats};

pub const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A transport on a fresh namespace `t_<test>_<random>`; its stream is deleted when it is dropped,
/// even when the test fails.
pub struct TestTransport(pub NatsTransport);

impl std::ops::Deref for TestTransport {
    type Target = NatsTransport;

    fn deref(&self) -> &NatsTransport {
        &self.0
    }
}

impl Drop for TestTransport {
    fn drop(&mut self) {
        // The test's runtime is blocked in this drop: delete through a connection of its own.
        let stream = self.0.stream_name().to_owned();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let connect = async_nats::connect(NATS_URL);
                let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(5), connect).await
                else {
                    return;
                };
                let jetstream = async_nats::jetstream::new(client);
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), jetstream.delete_stream(&stream))
                        .await;
            });
        })
        .join();
    }
}

/// A transport on a fresh namespace, or `None` (after a loud message) when the server is not
/// reachable.
pub async fn transport(test: &str) -> Option<TestTransport> {
    transport_with(test, |builder| builder).await
}

pub async fn transport_with(
    test: &str,
    configure: impl FnOnce(NatsTransportBuilder) -> NatsTransportBuilder,
) -> Option<TestTransport> {
    let builder = NatsTransport::builder(NATS_URL)
        .namespace(fresh_namespace(test))
        .connection_timeout(Duration::from_secs(3));
    let connect = configure(builder).connect();
    connect_or_skip("NATS JetStream", NATS_URL, test, connect)
        .await
        .map(TestTransport)
}
