//! Reading back what a Kafka-protocol broker holds, for the Kafka tests and the chaos harness.

use std::{collections::BTreeMap, time::Duration};

use outbox::transport::kafka::rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer},
    message::Headers,
};

/// One message as read back: topic, partition, offset, value, key and headers.
pub type Read = (
    String,
    i32,
    i64,
    Vec<u8>,
    Option<Vec<u8>>,
    BTreeMap<String, String>,
);

/// Every topic on the broker at `bootstrap` whose name starts with `prefix`.
pub fn topics_with_prefix(bootstrap: &str, prefix: &str) -> Result<Vec<String>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("a metadata client for {bootstrap}: {e}"))?;
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| format!("the metadata of {bootstrap}: {e}"))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| t.starts_with(prefix))
        .collect())
}

/// Every message of the topics named `prefix…` on the broker at `bootstrap`, from the
/// beginning, ordered by topic, partition and offset. Reads until nothing arrives for two
/// seconds (the broker's high watermarks are not relied on: tansu's `ListOffsets` does not
/// report them), for at most ten minutes.
pub fn try_read_all(bootstrap: &str, prefix: &str) -> Result<Vec<Read>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "outbox-tests-reader")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| format!("a reader of {bootstrap}: {e}"))?;
    let mut list = TopicPartitionList::new();
    for topic in topics_with_prefix(bootstrap, prefix)? {
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map_err(|e| format!("the metadata of {topic}: {e}"))?;
        for partition in metadata.topics()[0].partitions() {
            list.add_partition_offset(&topic, partition.id(), Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
    }
    if list.count() == 0 {
        return Ok(Vec::new());
    }
    consumer.assign(&list).map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while std::time::Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_secs(2)) else {
            break;
        };
        let message = message.map_err(|e| format!("reading {prefix}…: {e}"))?;
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        all.push((
            message.topic().to_owned(),
            message.partition(),
            message.offset(),
            message.payload().unwrap_or_default().to_vec(),
            message.key().map(<[u8]>::to_vec),
            headers,
        ));
    }
    all.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
    Ok(all)
}

/// [`try_read_all`], panicking on an error.
pub fn read_all(bootstrap: &str, prefix: &str) -> Vec<Read> {
    try_read_all(bootstrap, prefix).unwrap_or_else(|e| panic!("{e}"))
}
