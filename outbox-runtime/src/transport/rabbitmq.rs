//! RabbitMQ transport (in progress).
