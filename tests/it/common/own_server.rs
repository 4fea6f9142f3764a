//! Brokers of a test's own — NATS, Redis, RabbitMQ — on free ports, which the test can kill and
//! start again to show that nothing is lost. Never the machine's shared instances.

#![allow(dead_code, unreachable_pub)]

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::Duration,
};

use super::services_required;

/// Which broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// nats-server with JetStream.
    Nats,
    /// redis-server with an fsync-always append-only file, so acknowledged writes survive a kill.
    Redis,
    /// rabbitmq-server as a separate node with its own data directory.
    RabbitMq,
}

/// A broker process of the test's own.
pub struct OwnServer {
    broker: Broker,
    port: u16,
    dist_port: u16,
    name: String,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

fn free_port() -> Option<u16> {
    Some(
        std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port(),
    )
}

impl OwnServer {
    /// Start one, or `None` (after a loud message) when the broker cannot be started here.
    pub async fn start(broker: Broker, test: &str) -> Option<Self> {
        let port = free_port()?;
        let name = format!(
            "outbox{}{port}",
            test.replace(|c: char| !c.is_ascii_alphanumeric(), "")
        );
        let dir = std::env::temp_dir().join(format!("outbox-broker-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        let server = OwnServer {
            broker,
            port,
            dist_port: free_port()?,
            name,
            dir,
            child: Mutex::new(None),
        };
        if broker == Broker::RabbitMq {
            std::fs::write(server.dir.join("enabled_plugins"), "[].").ok()?;
            std::fs::write(
                server.dir.join("rabbitmq.conf"),
                format!("listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n"),
            )
            .ok()?;
            // The server drops to the `rabbitmq` user: it must own its directory.
            let _ = Command::new("chown")
                .args(["-R", "rabbitmq:rabbitmq"])
                .arg(&server.dir)
                .status();
        }
        if let Err(e) = server.resume().await {
            if services_required() {
                panic!("cannot start a {broker:?} server of the test's own: {e}");
            }
            eprintln!(
                "\n*** SKIPPED {test}: cannot start a {broker:?} server of its own ({e}) ***\n"
            );
            return None;
        }
        Some(server)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        match self.broker {
            Broker::Nats => format!("nats://127.0.0.1:{}", self.port),
            Broker::Redis => format!("redis://127.0.0.1:{}/", self.port),
            Broker::RabbitMq => format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port),
        }
    }

    fn command(&self) -> Command {
        let mut command = match self.broker {
            Broker::Nats => {
                let mut c = Command::new("nats-server");
                c.args([
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-js",
                    "-sd",
                ])
                .arg(&self.dir);
                c
            }
            Broker::Redis => {
                let mut c = Command::new("redis-server");
                c.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
                    .args([
                        "--save",
                        "",
                        "--appendonly",
                        "yes",
                        "--appendfsync",
                        "always",
                    ])
                    .arg("--dir")
                    .arg(&self.dir);
                c
            }
            Broker::RabbitMq => {
                let mut c = Command::new("rabbitmq-server");
                let node = format!("{}@localhost", self.name);
                c.env("RABBITMQ_NODENAME", node)
                    .env("RABBITMQ_NODE_PORT", self.port.to_string())
                    .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
                    .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq"))
                    .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
                    .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
                    .env("RABBITMQ_PID_FILE", self.dir.join("pid"))
                    .env(
                        "RABBITMQ_ENABLED_PLUGINS_FILE",
                        self.dir.join("enabled_plugins"),
                    );
                c
            }
        };
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command
    }

    /// Kill the broker, like a crash.
    pub fn stop(&self) {
        if self.broker == Broker::RabbitMq
            && let Ok(pid) = std::fs::read_to_string(self.dir.join("pid"))
        {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Start it again on the same port and data directory.
    pub async fn resume(&self) -> Result<(), String> {
        let child = self.command().spawn().map_err(|e| e.to_string())?;
        *self.child.lock().unwrap() = Some(child);
        for _ in 0..600 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "{:?} did not listen on port {} within 30 s",
            self.broker, self.port
        ))
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
