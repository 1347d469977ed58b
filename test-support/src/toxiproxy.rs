//! Grey failures on demand: [Toxiproxy](https://github.com/Shopify/toxiproxy) (started by `scripts/services.sh`)
//! between a component and a real server, driven through its REST API.
//!
//! A test creates its own [`Proxy`] in front of a server (listening on a port the OS picks), points the component
//! at [`Proxy::address`] instead of the server, and breaks the link while it runs: [`Proxy::blackhole`] (bytes
//! vanish, nothing is closed: a server that stops answering), [`Proxy::latency`], [`Proxy::bandwidth`],
//! [`Proxy::reset_connections`] (every open connection closed with a RST), then [`Proxy::heal`].
//!
//! ```no_run
//! # async fn demo() {
//! let services = test_support::Services::get();
//! let proxy = services.toxiproxy().proxy("pg", services.pg_host_port()).await;
//! let url = services.pg_url().replace(services.pg_host_port(), proxy.address());
//! proxy.blackhole().await;
//! // ... the component's calls hang: they must fail within their limit ...
//! proxy.heal().await;
//! proxy.delete().await;
//! # }
//! ```

use serde_json::{Value, json};

/// Toxiproxy's REST API.
#[derive(Debug, Clone)]
pub struct Toxiproxy {
    api: String,
    http: reqwest::Client,
}

/// One proxy: a listening port forwarding to an upstream server, with the toxics a test added.
#[derive(Debug, Clone)]
pub struct Proxy {
    toxiproxy: Toxiproxy,
    name: String,
    address: String,
}

impl Toxiproxy {
    /// The API at `api` (`http://127.0.0.1:<port>`).
    pub fn new(api: &str) -> Self {
        Self {
            api: api.trim_end_matches('/').to_string(),
            // Every API call is bounded: a Toxiproxy that stops answering fails the test, it does not hang it.
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()
                .expect("an HTTP client with a time-out"),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.api);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap_or_else(|e| {
            panic!(
                "Toxiproxy at {} does not answer ({e}): run scripts/services.sh up toxiproxy",
                self.api
            )
        });
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "Toxiproxy {method} {path} {body:?}: {status} {text}"
        );
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// The proxy named `name` (one `scripts/services.sh` created, such as the Kafka broker's).
    pub async fn existing(&self, name: &str) -> Proxy {
        let found = self
            .call(reqwest::Method::GET, &format!("/proxies/{name}"), None)
            .await;
        let address = found["listen"]
            .as_str()
            .unwrap_or_else(|| panic!("Toxiproxy has {found} for {name}: no listen address"))
            .to_string();
        Proxy {
            toxiproxy: self.clone(),
            name: name.to_string(),
            address,
        }
    }

    /// A new proxy named `<prefix>-<unique>` in front of `upstream` (`host:port`), listening on 127.0.0.1 on a
    /// port the OS picks.
    pub async fn proxy(&self, prefix: &str, upstream: &str) -> Proxy {
        let name = crate::unique_name(prefix);
        let created = self
            .call(
                reqwest::Method::POST,
                "/proxies",
                Some(json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true})),
            )
            .await;
        let address = created["listen"]
            .as_str()
            .unwrap_or_else(|| panic!("Toxiproxy created {created}: no listen address"))
            .to_string();
        Proxy {
            toxiproxy: self.clone(),
            name,
            address,
        }
    }
}

impl Proxy {
    /// `127.0.0.1:<port>`: where the component connects instead of the server.
    pub fn address(&self) -> &str {
        &self.address
    }

    async fn toxic(&self, name: &str, kind: &str, stream: &str, attributes: Value) {
        self.toxiproxy
            .call(
                reqwest::Method::POST,
                &format!("/proxies/{}/toxics", self.name),
                Some(
                    json!({"name": name, "type": kind, "stream": stream, "toxicity": 1.0,
                            "attributes": attributes}),
                ),
            )
            .await;
    }

    /// Bytes in both directions vanish and no connection is closed (Toxiproxy's `timeout` toxic with no timeout):
    /// a server, or a route, that stops answering. New connections are accepted and hang the same way.
    pub async fn blackhole(&self) {
        for stream in ["upstream", "downstream"] {
            self.toxic(
                &format!("blackhole-{stream}"),
                "timeout",
                stream,
                json!({"timeout": 0}),
            )
            .await;
        }
    }

    /// The server's replies vanish (Toxiproxy's `timeout` toxic with no timeout, downstream only); requests still
    /// reach it: a call the server carries out whose caller never hears back, an outcome unknown to it.
    pub async fn drop_replies(&self) {
        self.toxic(
            "drop-replies",
            "timeout",
            "downstream",
            json!({"timeout": 0}),
        )
        .await;
    }

    /// Delays every chunk from the server by `millis` (± `jitter` ms).
    pub async fn latency(&self, millis: u64, jitter: u64) {
        self.toxic(
            "latency",
            "latency",
            "downstream",
            json!({"latency": millis, "jitter": jitter}),
        )
        .await;
    }

    /// Limits the server's replies to `kilobytes_per_second`.
    pub async fn bandwidth(&self, kilobytes_per_second: u64) {
        self.toxic(
            "bandwidth",
            "bandwidth",
            "downstream",
            json!({"rate": kilobytes_per_second}),
        )
        .await;
    }

    /// Closes every open connection through the proxy (disable, then enable: new connections are accepted again).
    pub async fn reset_connections(&self) {
        for enabled in [false, true] {
            self.toxiproxy
                .call(
                    reqwest::Method::POST,
                    &format!("/proxies/{}", self.name),
                    Some(json!({"enabled": enabled})),
                )
                .await;
        }
    }

    /// Removes every toxic: the link works again (connections that stayed open resume).
    pub async fn heal(&self) {
        let toxics = self
            .toxiproxy
            .call(
                reqwest::Method::GET,
                &format!("/proxies/{}/toxics", self.name),
                None,
            )
            .await;
        for toxic in toxics.as_array().into_iter().flatten() {
            let name = toxic["name"].as_str().unwrap_or_default();
            self.toxiproxy
                .call(
                    reqwest::Method::DELETE,
                    &format!("/proxies/{}/toxics/{name}", self.name),
                    None,
                )
                .await;
        }
    }

    /// Removes the proxy (closing its connections).
    pub async fn delete(self) {
        self.toxiproxy
            .call(
                reqwest::Method::DELETE,
                &format!("/proxies/{}", self.name),
                None,
            )
            .await;
    }
}
