//! `catalogue`: print, write, check and render the event catalogue from a service's own binary.
//!
//! ```no_run
//! // src/bin/catalogue.rs of a service: `cargo run --bin catalogue -- check events.catalogue.json`
//! use my_service as _; // link the crate declaring the events and handlers
//! # mod my_service {}
//!
//! fn main() -> std::process::ExitCode {
//!     outbox_runtime::catalogue::cli::run(std::env::args().skip(1))
//! }
//! ```

use std::process::ExitCode;

use super::{AsyncApi, Catalogue, check};
use crate::transport::{KafkaTopics, Routing};

/// What `catalogue help` prints.
pub const USAGE: &str = "\
usage: catalogue [--from FILE] [COMMAND]

commands:
  json                 print the catalogue as JSON (the default)
  write FILE           write the catalogue as JSON to FILE (to commit it)
  check FILE           compare the code's catalogue with the committed FILE: exit 1 when an
                       event's schema or aggregate changed without a version bump, or a version
                       is not committed yet
  asyncapi [OPTIONS]   print the AsyncAPI 3.0 document (JSON)
      --transport nats|rabbitmq|redis|kafka   (default nats)
      --namespace NAME                        the transport's namespace (default outbox)
      --exchange NAME                         RabbitMQ exchange (default: the namespace)
      --stream-key KEY                        Redis stream (default: NAMESPACE:events)
      --kafka-topics aggregate|event|topic:NAME  Kafka routing (default aggregate)
      --title TEXT  --api-version TEXT        the document's info (default: events, 1.0.0)
  help                 this text

--from FILE reads the catalogue from a file instead of this binary (the `outbox` CLI links no
events of yours: run the catalogue from your service's binary, or render its file with --from).
";

/// Run the catalogue command line (`args` without the program name): 0 done, 1 the check
/// failed, 2 a bad command line or an unreadable file (the message on stderr).
pub fn run(args: impl IntoIterator<Item = String>) -> ExitCode {
    ExitCode::from(code(args))
}

/// [`run`], then exit the process with its status: for a `main` that returns something else.
pub fn exit(args: impl IntoIterator<Item = String>) -> ! {
    std::process::exit(i32::from(code(args)))
}

fn code(args: impl IntoIterator<Item = String>) -> u8 {
    match execute(args.into_iter().collect()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("catalogue: {message}");
            2
        }
    }
}

fn execute(mut args: Vec<String>) -> Result<u8, String> {
    let from = take_option(&mut args, "--from")?;
    let catalogue = match &from {
        Some(path) => Catalogue::from_json(&read(path)?).map_err(|e| format!("{path}: {e}"))?,
        None => Catalogue::linked(),
    };
    if from.is_none() && catalogue.events.is_empty() {
        eprintln!(
            "catalogue: no event types are linked into this binary; run it from the binary of \
             the service that declares them, or pass --from FILE"
        );
    }
    let command = if args.is_empty() {
        "json".to_owned()
    } else {
        args.remove(0)
    };
    match command.as_str() {
        "json" => {
            no_more(&args)?;
            print!("{}", catalogue.to_json());
            Ok(0)
        }
        "write" => {
            let path = one_path(&mut args, "write")?;
            std::fs::write(&path, catalogue.to_json())
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            eprintln!(
                "catalogue: wrote {} event versions to {path}",
                catalogue.events.len()
            );
            Ok(0)
        }
        "check" => {
            let path = one_path(&mut args, "check")?;
            let committed =
                Catalogue::from_json(&read(&path)?).map_err(|e| format!("{path}: {e}"))?;
            let findings = check(&committed, &catalogue);
            let failures = findings.iter().filter(|f| f.is_failure()).count();
            for finding in &findings {
                let label = if finding.is_failure() {
                    "error"
                } else {
                    "note"
                };
                println!("{label}: {finding}");
            }
            if failures > 0 {
                println!(
                    "catalogue check failed: {failures} incompatible change(s) against {path}"
                );
                Ok(1)
            } else {
                println!(
                    "catalogue check passed: {} event versions match {path}",
                    catalogue.events.len()
                );
                Ok(0)
            }
        }
        "asyncapi" => {
            let transport = take_option(&mut args, "--transport")?;
            let namespace =
                take_option(&mut args, "--namespace")?.unwrap_or_else(|| "outbox".to_owned());
            let exchange = take_option(&mut args, "--exchange")?;
            let stream_key = take_option(&mut args, "--stream-key")?;
            let kafka_topics = take_option(&mut args, "--kafka-topics")?;
            let title = take_option(&mut args, "--title")?.unwrap_or_else(|| "events".to_owned());
            let version =
                take_option(&mut args, "--api-version")?.unwrap_or_else(|| "1.0.0".to_owned());
            no_more(&args)?;
            let routing = match transport.as_deref().unwrap_or("nats") {
                "nats" => Routing::Nats { namespace },
                "rabbitmq" => Routing::RabbitMq {
                    exchange: exchange.unwrap_or(namespace),
                },
                "redis" => Routing::Redis {
                    stream_key: stream_key.unwrap_or_else(|| format!("{namespace}:events")),
                },
                "kafka" => Routing::Kafka {
                    namespace,
                    topics: match kafka_topics.as_deref() {
                        None | Some("aggregate") => KafkaTopics::AggregateType,
                        Some("event") => KafkaTopics::EventType,
                        Some(other) => match other.strip_prefix("topic:") {
                            Some(topic) if !topic.is_empty() => {
                                KafkaTopics::Topic(topic.to_owned())
                            }
                            _ => {
                                return Err(format!(
                                    "--kafka-topics `{other}`: expected aggregate, event or topic:NAME"
                                ));
                            }
                        },
                    },
                },
                other => {
                    return Err(format!(
                        "--transport `{other}`: expected nats, rabbitmq, redis or kafka"
                    ));
                }
            };
            let document = AsyncApi::new(title, version, routing).document(&catalogue);
            println!(
                "{}",
                serde_json::to_string_pretty(&document).expect("a document serializes")
            );
            Ok(0)
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(0)
        }
        other => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
}

/// Remove `--name VALUE` (or `--name=VALUE`) from `args`.
fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>, String> {
    let prefix = format!("{name}=");
    if let Some(i) = args.iter().position(|a| a.starts_with(&prefix)) {
        return Ok(Some(args.remove(i)[prefix.len()..].to_owned()));
    }
    let Some(i) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    if i + 1 >= args.len() {
        return Err(format!("{name} needs a value\n\n{USAGE}"));
    }
    args.remove(i);
    Ok(Some(args.remove(i)))
}

fn one_path(args: &mut Vec<String>, command: &str) -> Result<String, String> {
    if args.is_empty() {
        return Err(format!("{command} needs a FILE\n\n{USAGE}"));
    }
    let path = args.remove(0);
    no_more(args)?;
    Ok(path)
}

fn no_more(args: &[String]) -> Result<(), String> {
    match args.first() {
        None => Ok(()),
        Some(extra) => Err(format!("unexpected argument `{extra}`\n\n{USAGE}")),
    }
}
