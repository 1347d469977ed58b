//! Grey failures on demand: [Toxiproxy](https://github.com/Shopify/toxiproxy) (started by `scripts/services.sh`)
//! between a component and a real server, driven through its REST API.
//!
//! A test creates its own [`Proxy`] in front of a server (listening on a port the OS picks), points the component
//! at [`Proxy::address`] instead of the server, and breaks the link while it runs: [`Proxy::blackhole`] (bytes
//! vanish, nothing is closed: a server that stops answering), [`Proxy::latency`], [`Proxy::bandwidth`],
//! [`Proxy::reset_connections`] (every open connection closed with a RST), then [`Proxy::heal`].
//!
//! Toxiproxy can deadlock while it adds or removes a toxic (Shopify/toxiproxy#558): it interrupts each connection's
//! toxic, which waits to hand its data on, while that connection's writer, whose client stopped reading and then
//! went away, waits for the lock the removal holds. The proxy's toxics never answer again, and new connections
//! through it hang. A latency toxic on a busy Kafka link meets this often enough to fail a chaos run, so every
//! change of toxics here is bounded ([`TOXIC_CHANGE_BOUND`]): when it does not answer in time the proxy is
//! deleted and created again on the same address with the same upstream (deleting a proxy does not take that
//! lock), which closes its open connections; the test goes on with a healed link.
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
use std::time::Duration;

/// How long adding, listing or removing a proxy's toxics may take before the proxy is taken down and created again
/// (see the module's documentation). A healthy Toxiproxy answers in milliseconds.
pub const TOXIC_CHANGE_BOUND: Duration = Duration::from_secs(5);

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
    upstream: String,
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

    /// One API call: its JSON answer, or `None` when Toxiproxy does not answer within `bound`. Any other failure
    /// (refused, an error status) fails the test, naming the call.
    async fn call_within(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        bound: Duration,
    ) -> Option<Value> {
        let url = format!("{}{path}", self.api);
        let mut request = self.http.request(method.clone(), &url).timeout(bound);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let sent = async {
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.text().await?))
        };
        let (status, text) = match sent.await {
            Ok(answer) => answer,
            Err(e) if e.is_timeout() => return None,
            Err(e) => panic!(
                "Toxiproxy at {} does not answer {method} {path} ({e}): run scripts/services.sh up toxiproxy",
                self.api
            ),
        };
        assert!(
            status.is_success(),
            "Toxiproxy {method} {path} {body:?}: {status} {text}"
        );
        Some(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// One API call that must answer within the client's 10 s bound.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.call_within(method.clone(), path, body, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "Toxiproxy at {} did not answer {method} {path} within 10 s: is it overloaded or wedged? \
                     (scripts/services.sh down toxiproxy; scripts/services.sh up toxiproxy)",
                    self.api
                )
            })
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
        let upstream = found["upstream"]
            .as_str()
            .unwrap_or_else(|| panic!("Toxiproxy has {found} for {name}: no upstream"))
            .to_string();
        Proxy {
            toxiproxy: self.clone(),
            name: name.to_string(),
            address,
            upstream,
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
            upstream: upstream.to_string(),
        }
    }
}

impl Proxy {
    /// `127.0.0.1:<port>`: where the component connects instead of the server.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Toxiproxy's name for the proxy.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a toxic; if Toxiproxy wedges while adding it, the proxy is created again and the toxic added to it.
    async fn toxic(&self, name: &str, kind: &str, stream: &str, attributes: Value) {
        let path = format!("/proxies/{}/toxics", self.name);
        let toxic = json!({"name": name, "type": kind, "stream": stream, "toxicity": 1.0,
                           "attributes": attributes});
        let added = self
            .toxiproxy
            .call_within(
                reqwest::Method::POST,
                &path,
                Some(toxic.clone()),
                TOXIC_CHANGE_BOUND,
            )
            .await;
        if added.is_none() {
            self.recreate(&format!("adding the toxic {name}")).await;
            self.toxiproxy
                .call(reqwest::Method::POST, &path, Some(toxic))
                .await;
        }
    }

    /// Deletes the proxy and creates it again on the same address with the same upstream and no toxics: the way
    /// out when Toxiproxy wedges on the proxy's toxics (see the module's documentation). Its connections close.
    async fn recreate(&self, wedged_on: &str) {
        eprintln!(
            "Toxiproxy did not answer {wedged_on} on the proxy {} within {TOXIC_CHANGE_BOUND:?} \
             (Shopify/toxiproxy#558): deleting the proxy and creating it again on {} (its connections close)",
            self.name, self.address
        );
        self.remove().await;
        self.toxiproxy
            .call(
                reqwest::Method::POST,
                "/proxies",
                Some(
                    json!({"name": self.name, "listen": self.address, "upstream": self.upstream,
                            "enabled": true}),
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

    /// Removes every toxic: the link works again (connections that stayed open resume). If Toxiproxy wedges
    /// listing or removing them, the proxy is created again instead (its open connections close).
    pub async fn heal(&self) {
        let path = format!("/proxies/{}/toxics", self.name);
        let listed = self
            .toxiproxy
            .call_within(reqwest::Method::GET, &path, None, TOXIC_CHANGE_BOUND)
            .await;
        let Some(toxics) = listed else {
            return self.recreate("the list of toxics").await;
        };
        for toxic in toxics.as_array().into_iter().flatten() {
            let name = toxic["name"].as_str().unwrap_or_default();
            let removed = self
                .toxiproxy
                .call_within(
                    reqwest::Method::DELETE,
                    &format!("{path}/{name}"),
                    None,
                    TOXIC_CHANGE_BOUND,
                )
                .await;
            if removed.is_none() {
                return self
                    .recreate(&format!("the removal of the toxic {name}"))
                    .await;
            }
        }
    }

    /// Removes the proxy (closing its connections).
    pub async fn delete(self) {
        self.remove().await;
    }

    /// Toxiproxy's removal of the proxy: its listener and connections close.
    async fn remove(&self) {
        self.toxiproxy
            .call(
                reqwest::Method::DELETE,
                &format!("/proxies/{}", self.name),
                None,
            )
            .await;
    }
}
