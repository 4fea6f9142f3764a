//! The consumer group: creating it, and removing Redis consumers that have nothing pending
//! (a subscription's own when it ends, those left by crashed processes after a long idle time).

use std::time::Duration;

use ::redis::{RedisError, aio::ConnectionManager};

use super::{RedisTransport, TRANSPORT, connection::Failure, held::Ids};
use crate::transport::TransportError;

/// Consumers of the group with nothing pending are looked for this often.
pub(super) const JANITOR_INTERVAL: Duration = Duration::from_secs(300);

/// Consumers idle for less than this are never removed by the janitor.
pub(super) const JANITOR_MIN_IDLE: Duration = Duration::from_secs(600);

/// Removes a consumer from its group only when it has nothing pending, atomically:
/// `KEYS[1]` stream, `ARGV[1]` group, `ARGV[2]` consumer. Returns 0 when removed, -1 when kept.
const DELETE_IDLE_CONSUMER: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  return 0
end
return -1
";

impl RedisTransport {
    /// `XGROUP CREATE key group <start> MKSTREAM`; an existing group is kept as it is.
    pub(super) async fn create_group(&self, group: &str) -> Result<(), TransportError> {
        let key = &self.inner.stream_key;
        let mut cmd = ::redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(key)
            .arg(group)
            .arg(self.inner.config.group_start.id())
            .arg("MKSTREAM");
        match self.command(&cmd).await {
            Ok(_) => {
                tracing::info!(
                    stream = %key,
                    group,
                    start = ?self.inner.config.group_start,
                    "created the consumer group"
                );
                Ok(())
            }
            Err(Failure::Server { code, .. }) if code == "BUSYGROUP" => Ok(()),
            Err(Failure::Server { code, message }) if code == "WRONGTYPE" => {
                Err(TransportError::new(
                    TRANSPORT,
                    format!(
                        "cannot create consumer group `{group}`: key `{key}` holds a value that \
                         is not a stream ({message}); delete it or use another namespace"
                    ),
                ))
            }
            Err(failure) => Err(TransportError::new(
                TRANSPORT,
                format!("cannot create consumer group `{group}` on stream `{key}`: {failure}"),
            )),
        }
    }
}

/// Runs [`DELETE_IDLE_CONSUMER`] for `consumer`; `Ok(true)` when it was removed.
pub(super) async fn delete_if_idle(
    conn: &mut ConnectionManager,
    ids: &Ids,
    consumer: &str,
) -> Result<bool, RedisError> {
    let mut cmd = ::redis::cmd("EVAL");
    cmd.arg(DELETE_IDLE_CONSUMER)
        .arg(1)
        .arg(&ids.key)
        .arg(&ids.group)
        .arg(consumer);
    let removed = cmd.query_async::<i64>(conn).await? == 0;
    if removed {
        tracing::debug!(stream = %ids.key, group = %ids.group, consumer, "removed an idle consumer");
    }
    Ok(removed)
}
