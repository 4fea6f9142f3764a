//! NATS test support: a transport on a fresh namespace whose stream is deleted afterwards.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use outbox::transport::nats::{NatsTransport, NatsTransportBuilder, async_nats};
use uuid::Uuid;

use super::services_required;

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
    let random = Uuid::new_v4().simple().to_string();
    let namespace = format!("t_{test}_{}", &random[..10]);
    let builder = NatsTransport::builder(NATS_URL)
        .namespace(namespace)
        .connection_timeout(Duration::from_secs(3));
    let connect = configure(builder).connect();
    let error = match tokio::time::timeout(Duration::from_secs(15), connect).await {
        Ok(Ok(transport)) => return Some(TestTransport(transport)),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "connecting timed out".to_owned(),
    };
    if services_required() {
        panic!("NATS is required (OUTBOX_REQUIRE_SERVICES=1) but unavailable: {error}");
    }
    eprintln!(
        "\n*** SKIPPED {test}: NATS JetStream is not reachable at {NATS_URL} ({error}); start it to run this test ***\n"
    );
    None
}

/// A nats-server of the test's own, on a free port, that the test can stop and restart (never
/// the machine's shared instance). JetStream data survives restarts in its own directory.
pub struct OwnNatsServer {
    port: u16,
    dir: std::path::PathBuf,
    child: std::sync::Mutex<Option<std::process::Child>>,
}

impl OwnNatsServer {
    /// Start one, or `None` (after a loud message) when nats-server is not installed.
    pub async fn start(test: &str) -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = std::env::temp_dir().join(format!("outbox-nats-{test}-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        let server = OwnNatsServer {
            port,
            dir,
            child: std::sync::Mutex::new(None),
        };
        if let Err(e) = server.resume().await {
            if services_required() {
                panic!("cannot start a nats-server of the test's own: {e}");
            }
            eprintln!("\n*** SKIPPED {test}: cannot start nats-server ({e}) ***\n");
            return None;
        }
        Some(server)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill the server (like a crash).
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port and store.
    pub async fn resume(&self) -> Result<(), String> {
        let child = std::process::Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        *self.child.lock().unwrap() = Some(child);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("nats-server did not listen on port {}", self.port))
    }
}

impl Drop for OwnNatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
