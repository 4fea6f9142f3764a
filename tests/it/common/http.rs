//! A real HTTP server and client for the webhook tests: the receiver runs as an axum app on a
//! loopback port, requests go through hyper's client; and a TCP proxy in front of a database
//! server that can be cut (fault injection: the database "stops" for one connection pool while
//! the server goes on serving the other tests).

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, header::HeaderMap};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::{net::TcpListener, task::JoinHandle};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with its own connection pool.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Serve `app` on a free loopback port until the handle is aborted.
pub async fn serve(app: axum::Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, task)
}

/// An answer: status, body, `Retry-After`, every header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: String,
    pub retry_after: Option<String>,
    pub headers: HeaderMap,
}

impl Answer {
    /// The `status` field of a JSON answer (`received`, `duplicate`, `conflict`).
    pub fn outcome(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["status"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// `POST url` with `headers` and a JSON `body`; `Err` when no answer came (the connection failed).
pub async fn post(
    client: &HttpClient,
    url: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<Answer, String> {
    send(client, hyper::Method::POST, url, headers, body).await
}

/// `method url` with `headers` (a JSON content type unless they say otherwise) and `body`;
/// `Err` when no answer came (the connection failed).
pub async fn send(
    client: &HttpClient,
    method: hyper::Method,
    url: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<Answer, String> {
    let mut request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(name, value.clone());
    }
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let headers = response.headers().clone();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        retry_after,
        headers,
    })
}

/// A TCP proxy to `target` that can be cut: while down, open connections are closed and new
/// ones are closed as soon as they are accepted. It can be pointed at another server, as a
/// failover moves a database's address.
pub struct Proxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    target: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let target = Arc::new(Mutex::new(target));
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let up = up.clone();
            let target = target.clone();
            let connections = connections.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !up.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let target = *target.lock().unwrap();
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().unwrap().push(task);
                }
            }
        });
        Proxy {
            addr,
            up,
            target,
            connections,
            accept,
        }
    }

    /// The database is gone: every connection through the proxy is cut.
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// The database is back.
    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// New connections go to `target` from now on (open ones are left as they are).
    pub fn point_to(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = target;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.down();
        self.accept.abort();
    }
}

/// `url` with its `host:port` replaced by `addr`.
pub fn through(url: &str, addr: SocketAddr) -> String {
    let start = url
        .find('@')
        .map_or_else(|| url.find("//").unwrap() + 2, |i| i + 1);
    let end = start + url[start..].find('/').unwrap();
    format!("{}{addr}{}", &url[..start], &url[end..])
}

/// The `host:port` of `url`.
pub fn server_of(url: &str) -> SocketAddr {
    let start = url
        .find('@')
        .map_or_else(|| url.find("//").unwrap() + 2, |i| i + 1);
    let end = start + url[start..].find('/').unwrap();
    url[start..end].parse().unwrap()
}
