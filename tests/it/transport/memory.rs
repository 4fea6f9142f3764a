//! The in-memory transport's fixture for the shared suite: its log stands for a broker's stream.

use outbox::transport::{OutgoingMessage, Transport, memory::MemoryTransport};

use super::{Fixture, Stored};

/// An in-memory transport of the test's own.
pub(crate) struct Memory {
    transport: MemoryTransport,
    namespace: String,
}

#[async_trait::async_trait]
impl Fixture for Memory {
    const NAME: &'static str = "memory";
    const CONTENT_TYPE: Option<&'static str> = None;

    async fn open(test: &str) -> Option<Self> {
        let namespace = format!("t_{test}");
        Some(Memory {
            transport: MemoryTransport::with_namespace(namespace.clone()),
            namespace,
        })
    }

    fn transport(&self) -> &dyn Transport {
        &self.transport
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The transport's log.
    async fn stored(&self) -> Vec<Stored> {
        self.transport
            .messages()
            .into_iter()
            .map(|m| Stored {
                message_id: m.event_id.to_string(),
                event_type: m.event_type,
                content_type: None,
                body: m.body.to_vec(),
                fields: [
                    ("seq".to_owned(), m.seq.to_string()),
                    ("subject".to_owned(), m.subject),
                ]
                .into(),
            })
            .collect()
    }

    fn check_stored(&self, i: usize, stored: &Stored, sent: &OutgoingMessage) {
        assert_eq!(stored.field("seq"), (i + 1).to_string());
        assert_eq!(
            stored.field("subject"),
            format!("{}.{}", self.namespace, sent.event_type)
        );
    }
}
