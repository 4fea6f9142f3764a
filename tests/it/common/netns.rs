//! A network the test can partition silently: a network namespace of the test's own
//! (`ip netns`), joined to the host by a veth pair, with a broker of the test's own inside.
//!
//! The host side is `10.231.X.1/30`, the namespace side `10.231.X.2/30`, `X` unique per network
//! in this process and across processes (derived from the pid and a counter; the kernel refuses
//! a namespace name already taken, and the next `X` is tried). Before any link comes up, a
//! blackhole route for the /30 (metric 4000) is added on the host, so that traffic to the
//! namespace can never leave through the default route, whatever happens to the veth's route.
//!
//! [`partition`](Partitionable::partition) drops every packet between the host and the broker
//! inside the namespace, without a reset, an ICMP error or a local error, so every open
//! connection goes silent, as with a cable pulled far away or a firewall dropping packets;
//! [`heal`](Partitionable::heal) ends it. Drop kills the broker and removes the namespace, the
//! veth and the blackhole route.

#![allow(dead_code, unreachable_pub)]

use std::{
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

use super::own_server::{Broker, OwnServer};
use super::services_required;

/// Networks created by this process, to derive the next `X`.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace with a broker inside, which the test can cut off and join again.
pub struct Partitionable {
    /// The broker; dropped (killed) before the network goes.
    server: Option<OwnServer>,
    /// `outbox-part-X`.
    netns: String,
    /// The host side of the veth pair, `obhX`.
    host_link: String,
    /// The namespace side of the veth pair, `obnX`.
    ns_link: String,
    /// `10.231.X.0/30`.
    subnet: String,
    /// `10.231.X.2`, where the broker listens.
    address: String,
    /// Whether the blackhole route was added (and must be removed).
    blackhole: bool,
}

/// Runs `ip args…`; `Err` with its stderr when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn skip_or_fail(test: &str, why: &str) {
    if services_required() {
        panic!(
            "{test}: a network namespace is required (OUTBOX_REQUIRE_SERVICES=1) but cannot be \
             made here: {why}"
        );
    }
    eprintln!(
        "\n*** SKIPPED {test}: cannot make a network namespace ({why}); run as root with \
         iproute2 to run this test ***\n"
    );
}

impl Partitionable {
    /// A fresh namespace with `broker` running inside, or `None` (after a loud message) when
    /// namespaces cannot be made here; with `OUTBOX_REQUIRE_SERVICES=1` that is a failure.
    pub async fn with_broker(broker: Broker, test: &str) -> Option<Self> {
        let mut network = match Self::create() {
            Ok(network) => network,
            Err(why) => {
                skip_or_fail(test, &why);
                return None;
            }
        };
        network.server = Some(
            OwnServer::start_in_namespace(broker, test, &network.netns, &network.address).await?,
        );
        Some(network)
    }

    /// A fresh namespace with a Kafka broker inside whose log outlives it
    /// ([`OwnServer::start_durable_kafka`]): killed and started again, it still has what it
    /// confirmed. `None` (after a loud message) as [`with_broker`](Self::with_broker).
    pub async fn with_durable_kafka(test: &str) -> Option<Self> {
        let mut network = match Self::create() {
            Ok(network) => network,
            Err(why) => {
                skip_or_fail(test, &why);
                return None;
            }
        };
        network.server = Some(
            OwnServer::start_durable_kafka(test, Some((&network.netns, &network.address))).await?,
        );
        Some(network)
    }

    /// Claim a free `X` and build the network.
    fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let mut last_error = String::new();
        for _ in 0..256 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let x = (pid.wrapping_mul(7).wrapping_add(n)) % 256;
            let netns = format!("outbox-part-{x}");
            // The kernel refuses a name in use: whoever created it owns this `X`.
            if let Err(e) = ip(&["netns", "add", &netns]) {
                if e.contains("File exists") {
                    last_error = e;
                    continue;
                }
                return Err(e);
            }
            let mut network = Partitionable {
                server: None,
                netns,
                host_link: format!("obh{x}"),
                ns_link: format!("obn{x}"),
                subnet: format!("10.231.{x}.0/30"),
                address: format!("10.231.{x}.2"),
                blackhole: false,
            };
            // On failure, drop removes whatever was made.
            network.build(x)?;
            return Ok(network);
        }
        Err(format!("no free 10.231.X.0/30 network: {last_error}"))
    }

    fn build(&mut self, x: u32) -> Result<(), String> {
        // Safety first: traffic to the subnet can never take the default route.
        ip(&["route", "add", "blackhole", &self.subnet, "metric", "4000"])?;
        self.blackhole = true;
        ip(&[
            "link",
            "add",
            &self.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &self.ns_link,
            "netns",
            &self.netns,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("10.231.{x}.1/30"),
            "dev",
            &self.host_link,
        ])?;
        self.in_netns(&[
            "addr",
            "add",
            &format!("10.231.{x}.2/30"),
            "dev",
            &self.ns_link,
        ])?;
        // Strict reverse-path filtering inside: what comes from the host while the way back
        // to it is a blackhole (a partition) is dropped on arrival, without a word.
        self.exec_in_netns(&["sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/all/rp_filter"])?;
        self.in_netns(&["link", "set", "lo", "up"])?;
        self.in_netns(&["link", "set", &self.ns_link, "up"])?;
        ip(&["link", "set", &self.host_link, "up"])?;
        Ok(())
    }

    /// `ip netns exec NS ip args…`.
    fn in_netns(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["ip"];
        all.extend_from_slice(args);
        self.exec_in_netns(&all)
    }

    /// `ip netns exec NS args…`.
    fn exec_in_netns(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.netns];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// The broker inside.
    pub fn server(&self) -> &OwnServer {
        self.server.as_ref().expect("a broker")
    }

    /// Where the broker listens: `10.231.X.2`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Cut the broker off silently, as a partition in the network does: packets in both
    /// directions are lost without a reset, an ICMP error or a local error. Inside the
    /// namespace, the way back to the host becomes a blackhole: the broker's packets go nowhere,
    /// and the host's, which still leave the host as if all was well, fail the strict
    /// reverse-path check on arrival and are dropped. Open connections go silent; new ones hang.
    ///
    /// (Taking a veth end down is not silent enough: the host's end loses its carrier, its
    /// packets fail to leave the host, and TCP, told so, retries every half second instead of
    /// backing off, so that old connections revive at once when the link returns and a
    /// transport that never notices a dead socket looks fine. Never the host side's link or
    /// routes: the host's route to the subnet must stay.)
    pub fn partition(&self) {
        self.in_netns(&["route", "add", "blackhole", &self.host_address()])
            .expect("cutting the namespace off");
    }

    /// Join the broker again.
    pub fn heal(&self) {
        self.in_netns(&["route", "del", "blackhole", &self.host_address()])
            .expect("joining the namespace again");
    }

    /// Take the namespace's end of the veth down (see [`partition`](Self::partition) for why
    /// that is not a silent partition for connections already open).
    pub fn link_down(&self) {
        self.in_netns(&["link", "set", &self.ns_link, "down"])
            .expect("taking the namespace's link down");
    }

    /// Bring the namespace's end of the veth up again.
    pub fn link_up(&self) {
        self.in_netns(&["link", "set", &self.ns_link, "up"])
            .expect("bringing the namespace's link up");
    }

    /// The host's end: `10.231.X.1`.
    fn host_address(&self) -> String {
        let (prefix, _) = self.address.rsplit_once('.').expect("an IPv4 address");
        format!("{prefix}.1")
    }
}

impl Drop for Partitionable {
    fn drop(&mut self) {
        // The broker first: deleting a namespace does not end its processes.
        drop(self.server.take());
        let _ = ip(&["netns", "del", &self.netns]);
        // Gone with the namespace's end of the pair, normally.
        let _ = ip(&["link", "del", &self.host_link]);
        if self.blackhole {
            let _ = ip(&["route", "del", "blackhole", &self.subnet, "metric", "4000"]);
        }
    }
}
