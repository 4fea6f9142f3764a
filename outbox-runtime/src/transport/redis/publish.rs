//! Publishing: one `XADD` per message, sent in pipelines, and the mapping of every reply to a
//! per-message result.

use crate::transport::publish_results;
use std::fmt;

use ::redis::{Cmd, RedisError, Value};

use super::{RedisTransport, connection::is_connection_error};
use crate::transport::{OutgoingMessage, PublishError};

/// The value of every entry's `content-type` field.
pub use crate::transport::CONTENT_TYPE;

/// Messages sent in one pipeline, at most.
const PUBLISH_CHUNK_MESSAGES: usize = 1_000;

/// Body bytes sent in one pipeline, at most (a single larger message is sent alone).
const PUBLISH_CHUNK_BYTES: usize = 16 * 1024 * 1024;

/// Redis refuses arguments longer than `proto-max-bulk-len` (default 512 MiB).
const MAX_BODY_BYTES: usize = 512 * 1024 * 1024;

impl RedisTransport {
    /// [`Transport::publish`](crate::transport::Transport::publish): splits the batch into
    /// pipelines and sends them one after the other.
    pub(super) async fn publish_all(
        &self,
        messages: &[OutgoingMessage],
    ) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut failed: Option<PublishError> = None;
        let mut index = 0;
        while index < messages.len() {
            let mut members = Vec::new();
            let mut bytes = 0;
            while index < messages.len() && members.len() < PUBLISH_CHUNK_MESSAGES {
                let message = &messages[index];
                if let Some(error) = &failed {
                    results[index] = Some(Err(error.clone()));
                } else if message.body.len() > MAX_BODY_BYTES {
                    results[index] = Some(Err(PublishError::Permanent(format!(
                        "event `{}` ({}) is {} bytes, over Redis' 512 MiB argument limit",
                        message.event_id,
                        message.event_type,
                        message.body.len()
                    ))));
                } else if !members.is_empty() && bytes + message.body.len() > PUBLISH_CHUNK_BYTES {
                    break;
                } else {
                    bytes += message.body.len();
                    members.push(index);
                }
                index += 1;
            }
            if members.is_empty() {
                continue;
            }
            if let Some(error) = self.publish_chunk(messages, &members, &mut results).await {
                failed = Some(error);
            }
        }
        publish_results(results)
    }

    /// The `XADD` of one message.
    fn xadd(&self, message: &OutgoingMessage) -> Cmd {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(&self.inner.stream_key);
        if let Some(max_len) = self.inner.config.max_len {
            let mode = if self.inner.config.exact_trim {
                "="
            } else {
                "~"
            };
            cmd.arg("MAXLEN").arg(mode).arg(max_len);
        }
        cmd.arg("*")
            .arg("id")
            .arg(message.event_id.to_string())
            .arg("type")
            .arg(&message.event_type)
            .arg("aggregate")
            .arg(format!(
                "{}/{}",
                message.aggregate_type, message.aggregate_id
            ))
            .arg("content-type")
            .arg(CONTENT_TYPE)
            .arg("body")
            .arg(message.body.as_ref());
        cmd
    }

    /// A per-message error for a server error reply to an `XADD`.
    fn rejected(&self, code: &str, detail: impl fmt::Display) -> PublishError {
        let key = &self.inner.stream_key;
        match code {
            "WRONGTYPE" => PublishError::Rejected(format!(
                "key `{key}` holds a value that is not a stream ({detail}); delete it or use \
                 another namespace"
            )),
            "OOM" => PublishError::Rejected(format!(
                "Redis is out of memory (maxmemory reached) and refused `XADD` to `{key}`: \
                 {detail}"
            )),
            _ => PublishError::Rejected(format!("Redis refused `XADD` to `{key}`: {detail}")),
        }
    }

    /// Sends one pipeline and maps every reply.
    async fn publish_chunk(
        &self,
        messages: &[OutgoingMessage],
        members: &[usize],
        results: &mut [Option<Result<(), PublishError>>],
    ) -> Option<PublishError> {
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        for &index in members {
            pipe.add_command(self.xadd(&messages[index]));
        }
        let timeout = self.inner.config.publish_timeout;
        // A publish without its replies in time does not replace the connection: the server may
        // only be slow (or paused) and apply the entries later; the health check's `PING`
        // decides whether the connection is dead.
        let mut conn = self.shared();
        let replies =
            match tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await {
                Ok(Ok(replies)) => replies,
                Ok(Err(err)) => {
                    let error = self.map_publish_error(err);
                    for &index in members {
                        results[index] = Some(Err(error.clone()));
                    }
                    return Some(error);
                }
                Err(_elapsed) => {
                    let error = PublishError::Timeout(timeout);
                    for &index in members {
                        results[index] = Some(Err(error.clone()));
                    }
                    return Some(error);
                }
            };
        if replies.len() != members.len() {
            let error = PublishError::Connection(format!(
                "expected {} `XADD` replies, got {}",
                members.len(),
                replies.len()
            ));
            for &index in members {
                results[index] = Some(Err(error.clone()));
            }
            return Some(error);
        }
        for (&index, reply) in members.iter().zip(replies) {
            results[index] = Some(match reply {
                // The entry id: stored.
                Value::BulkString(_) | Value::SimpleString(_) => Ok(()),
                Value::ServerError(err) => Err(self.rejected(err.code(), &err)),
                other => Err(PublishError::Rejected(format!(
                    "unexpected `XADD` reply: {other:?}"
                ))),
            });
        }
        None
    }

    fn map_publish_error(&self, err: RedisError) -> PublishError {
        if err.is_timeout() {
            PublishError::Timeout(self.inner.config.publish_timeout)
        } else if is_connection_error(&err) {
            PublishError::Connection(format!("publish to `{}`: {err}", self.inner.server))
        } else if let Some(code) = err.code() {
            let code = code.to_owned();
            self.rejected(&code, err)
        } else {
            PublishError::Rejected(format!("publish to `{}`: {err}", self.inner.stream_key))
        }
    }
}
