//! RabbitMQ test support: a transport on a fresh namespace whose exchange and queues are deleted
//! afterwards, and a TCP proxy that can cut and restore connections to the broker.

#![allow(dead_code, unreachable_pub)]

use std::{sync::Mutex, time::Duration};

use super::{connect_or_skip, fresh_namespace};
use outbox::transport::{
    SubscribeOptions, Subscription, Transport,
    rabbitmq::{
        RabbitMqTransport, RabbitMqTransportBuilder,
        lapin::{
            self,
            options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions},
            types::FieldTable,
        },
    },
};

// ---------------------------------------------------------------------------------------------
// Harness: a transport on a fresh namespace whose exchange and queues are deleted afterwards.
// ---------------------------------------------------------------------------------------------

pub fn rabbitmq_url() -> String {
    std::env::var("OUTBOX_TEST_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A transport on a fresh namespace `t_<test>_<random>`. The exchange and every queue the test
/// declared through it are deleted when it is dropped, even when the test fails.
pub struct TestTransport {
    pub transport: RabbitMqTransport,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl std::ops::Deref for TestTransport {
    type Target = RabbitMqTransport;

    fn deref(&self) -> &RabbitMqTransport {
        &self.transport
    }
}

impl Drop for TestTransport {
    fn drop(&mut self) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap_or_else(|e| e.into_inner()));
        let exchanges =
            std::mem::take(&mut *self.exchanges.lock().unwrap_or_else(|e| e.into_inner()));
        // The test's runtime is blocked in this drop: delete through a connection of its own.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let url = rabbitmq_url();
                let connect =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
                let Ok(Ok(connection)) =
                    tokio::time::timeout(Duration::from_secs(5), connect).await
                else {
                    return;
                };
                let Ok(channel) = connection.create_channel().await else {
                    return;
                };
                let limit = Duration::from_secs(5);
                for queue in queues {
                    let delete =
                        channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
                    let _ = tokio::time::timeout(limit, delete).await;
                }
                for exchange in exchanges {
                    let delete = channel.exchange_delete(
                        exchange.as_str().into(),
                        ExchangeDeleteOptions::default(),
                    );
                    let _ = tokio::time::timeout(limit, delete).await;
                }
                let _ = tokio::time::timeout(limit, connection.close(200, "OK".into())).await;
            });
        })
        .join();
    }
}

impl TestTransport {
    /// Deletes `queue` at the end of the test.
    pub fn track_queue(&self, queue: &str) {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(queue.to_owned());
    }

    /// Subscribes the consumer group `consumer`; its queue is deleted at the end of the test.
    pub async fn subscribe_as(
        &self,
        consumer: &str,
        event_types: &[&str],
        options: &SubscribeOptions,
    ) -> Box<dyn Subscription> {
        self.track_queue(&self.queue_name(consumer));
        self.transport
            .subscribe(consumer, &types(event_types), options)
            .await
            .expect("subscribe")
    }

    /// Declares the queue of `consumer` bound to `event_types`, without consuming.
    pub async fn declare_queue(&self, consumer: &str, event_types: &[&str]) -> String {
        self.track_queue(&self.queue_name(consumer));
        self.transport
            .declare_consumer_queue(consumer, &types(event_types))
            .await
            .expect("declare the consumer queue")
    }

    /// Messages ready in `queue` (not counting deliveries awaiting an ack).
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let channel = self.channel().await.expect("channel");
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
            .expect("the queue exists");
        declared.message_count()
    }
}

/// A transport on a fresh namespace, or `None` (after a loud message) when the broker is not
/// reachable.
pub async fn transport(test: &str) -> Option<TestTransport> {
    transport_with(test, |builder| builder).await
}

pub async fn transport_with(
    test: &str,
    configure: impl FnOnce(RabbitMqTransportBuilder) -> RabbitMqTransportBuilder,
) -> Option<TestTransport> {
    transport_at(test, &rabbitmq_url(), configure).await
}

/// A transport on a fresh namespace that connects to `url` (cleanup still goes to the broker
/// directly).
pub async fn transport_at(
    test: &str,
    url: &str,
    configure: impl FnOnce(RabbitMqTransportBuilder) -> RabbitMqTransportBuilder,
) -> Option<TestTransport> {
    let builder = RabbitMqTransport::builder(url)
        .namespace(fresh_namespace(test))
        .connection_timeout(Duration::from_secs(3));
    let connect = configure(builder).connect();
    let transport = connect_or_skip("RabbitMQ", "127.0.0.1:5672", test, connect).await?;
    let exchange = transport.exchange().to_owned();
    Some(TestTransport {
        transport,
        queues: Mutex::new(Vec::new()),
        exchanges: Mutex::new(vec![exchange]),
    })
}

/// A TCP proxy in front of the broker that the test can cut (like a broker crash or a network
/// failure: every proxied connection is dropped and new ones are refused) and restore, without
/// touching the machine's shared RabbitMQ.
pub struct BrokerProxy {
    port: u16,
    target: std::net::SocketAddr,
    acceptor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    links: std::sync::Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl BrokerProxy {
    pub async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let proxy = BrokerProxy {
            port,
            target,
            acceptor: Mutex::new(None),
            links: Default::default(),
        };
        proxy.accept_on(listener);
        proxy
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    pub fn accept_on(&self, listener: tokio::net::TcpListener) {
        let links = self.links.clone();
        let target = self.target;
        let acceptor = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                links.lock().unwrap_or_else(|e| e.into_inner()).push(link);
            }
        });
        *self.acceptor.lock().unwrap_or_else(|e| e.into_inner()) = Some(acceptor);
    }

    /// Drop every proxied connection and refuse new ones.
    pub fn cut(&self) {
        if let Some(acceptor) = self
            .acceptor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            acceptor.abort();
        }
        for link in self
            .links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            link.abort();
        }
    }

    /// Accept connections again, on the same port.
    pub async fn restore(&self) {
        for _ in 0..100 {
            if let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                self.accept_on(listener);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot listen on proxy port {} again", self.port);
    }
}

impl Drop for BrokerProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

pub fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}
