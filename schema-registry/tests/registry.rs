//! The client against the real registry of the test services (Apicurio Registry's Confluent-compatible API, basic
//! auth on), and against sockets that misbehave: a registry that does not answer is bounded, one that refuses is
//! not retried, and credentials never show in errors.

use std::time::{Duration, Instant};

use connector_api::RetryPolicy;
use schema_registry::{RegistrySettings, SchemaRegistry, SchemaType, SubjectStrategy};
use test_support::{RegistryEndpoint, Services};

fn settings(registry: &RegistryEndpoint) -> RegistrySettings {
    RegistrySettings {
        username: Some(registry.user.clone()),
        password: Some(registry.password.clone().into()),
        ..RegistrySettings::new(&registry.url)
    }
}

/// Registers `schema` under `subject` the way any producer would (`POST /subjects/{subject}/versions`); its id.
async fn register(registry: &RegistryEndpoint, subject: &str, schema: &str) -> u32 {
    let body = reqwest::Client::new()
        .post(format!("{}/subjects/{subject}/versions", registry.url))
        .basic_auth(&registry.user, Some(&registry.password))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .body(serde_json::json!({ "schema": schema }).to_string())
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let response: serde_json::Value = serde_json::from_slice(&body).unwrap();
    u32::try_from(response["id"].as_u64().unwrap()).unwrap()
}

fn order(extra: &str) -> String {
    format!(
        r#"{{"type":"record","name":"Order","namespace":"ratchet.test","fields":[{{"name":"id","type":"long"}}{extra}]}}"#
    )
}

#[tokio::test]
async fn schemas_are_found_by_id_and_subject_with_a_trailing_slash_too() {
    let registry = Services::get().registry();
    let topic = test_support::unique_name("registry-client");
    let subject = SubjectStrategy::TopicName
        .subject(&topic, false, None)
        .unwrap();
    let first = register(&registry, &subject, &order("")).await;
    let second = register(
        &registry,
        &subject,
        &order(r#",{"name":"note","type":["null","string"],"default":null}"#),
    )
    .await;
    assert_ne!(first, second);

    for url in [registry.url.clone(), format!("{}/", registry.url)] {
        let client = SchemaRegistry::new(&RegistrySettings {
            url,
            ..settings(&registry)
        })
        .unwrap();
        let latest = client.latest(&subject).await.unwrap();
        assert_eq!(latest.id, second);
        assert_eq!(latest.version, Some((subject.clone(), 2)));
        assert_eq!(latest.schema_type, SchemaType::Avro);
        let by_id = client.schema(first).await.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&by_id.schema).unwrap(),
            serde_json::from_str::<serde_json::Value>(&order("")).unwrap()
        );
        assert!(by_id.references.is_empty());
    }

    let client = SchemaRegistry::new(&settings(&registry)).unwrap();
    let missing = client.schema(first + second + 1_000_000).await.unwrap_err();
    assert!(
        missing.is_not_found() && !missing.is_transient(),
        "{missing}"
    );
    let missing = client.latest(&format!("{subject}-none")).await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
    assert!(missing.to_string().contains("-none"), "{missing}");
}

#[tokio::test]
async fn wrong_credentials_are_refused_at_once_and_never_shown() {
    let registry = Services::get().registry();
    let id = register(
        &registry,
        &test_support::unique_name("registry-auth"),
        &order(""),
    )
    .await;
    let wrong = SchemaRegistry::new(&RegistrySettings {
        password: Some("not-the-password".to_string().into()),
        ..settings(&registry)
    })
    .unwrap();
    let started = Instant::now();
    let err = wrong.schema(id).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refusal is not retried"
    );
    assert!(!err.is_transient(), "{err}");
    let text = format!("{err} {err:?}");
    assert!(text.contains("401"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");

    let anonymous = SchemaRegistry::new(&RegistrySettings::new(&registry.url)).unwrap();
    assert!(
        anonymous
            .schema(id)
            .await
            .unwrap_err()
            .to_string()
            .contains("401")
    );
}

#[tokio::test]
async fn a_registry_that_never_answers_is_bounded_and_retried_then_transient() {
    // Accepts connections and reads requests, never answers: a hung server, not a refusing one.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let client = SchemaRegistry::new(&RegistrySettings {
        request_timeout: Duration::from_millis(300),
        ..RegistrySettings::new(&format!("http://{address}"))
    })
    .unwrap()
    .with_retry(RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
        max_total_backoff: Duration::from_millis(100),
    });
    let started = Instant::now();
    let err = client.schema(1).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        err.to_string()
            .contains("did not answer GET /schemas/ids/1"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "three bounded attempts"
    );
}

#[tokio::test]
async fn a_bearer_token_is_sent_as_the_authorization_header() {
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = server.local_addr().unwrap();
    let seen = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = server.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buffer).await.unwrap();
            request.extend_from_slice(&buffer[..n]);
        }
        let body = r#"{"schema":"\"long\""}"#;
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(reply.as_bytes()).await.unwrap();
        String::from_utf8(request).unwrap()
    });
    let client = SchemaRegistry::new(&RegistrySettings {
        bearer_token: Some("tok3n".to_string().into()),
        ..RegistrySettings::new(&format!("http://{address}"))
    })
    .unwrap();
    let schema = client.schema(5).await.unwrap();
    assert_eq!((schema.id, schema.schema.as_str()), (5, "\"long\""));
    let request = seen.await.unwrap().to_lowercase();
    assert!(request.starts_with("get /schemas/ids/5 "), "{request}");
    assert!(request.contains("authorization: bearer tok3n"), "{request}");
    // Cached: a second lookup of the same id makes no request (the server above answers once only).
    assert_eq!(client.schema(5).await.unwrap().schema, "\"long\"");
}

#[tokio::test]
async fn https_trusts_the_ca_file_and_a_failed_check_is_not_retried() {
    let services = Services::get();
    let registry = services.registry();
    let subject = test_support::unique_name("registry-tls");
    let id = register(&registry, &subject, &order("")).await;
    let ca = std::path::PathBuf::from(services.var("RATCHET_TLS_CA"));

    let trusted = SchemaRegistry::new(&RegistrySettings {
        url: registry.tls_url.clone(),
        ca_file: Some(ca),
        ..settings(&registry)
    })
    .unwrap();
    assert_eq!(trusted.latest(&subject).await.unwrap().id, id);

    // The system trust store does not know the test CA: refused at once, naming the TLS check.
    let untrusted = SchemaRegistry::new(&RegistrySettings {
        url: registry.tls_url.clone(),
        ..settings(&registry)
    })
    .unwrap();
    let started = Instant::now();
    let err = untrusted.schema(id).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("failed the TLS checks"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "not retried");

    // Encrypted without authenticating the server, when asked for.
    let unchecked = SchemaRegistry::new(&RegistrySettings {
        url: registry.tls_url.clone(),
        server_check: schema_registry::ServerCheckSetting::Off,
        ..settings(&registry)
    })
    .unwrap();
    assert_eq!(unchecked.schema(id).await.unwrap().id, id);
}

#[tokio::test]
async fn registering_is_idempotent_and_an_incompatible_change_is_refused() {
    let registry = Services::get().registry();
    let client = SchemaRegistry::new(&settings(&registry)).unwrap();
    let subject = test_support::unique_name("registry-register");
    let first = client.register(&subject, &order("")).await.unwrap();
    assert_eq!(client.register(&subject, &order("")).await.unwrap(), first);
    let added = order(r#",{"name":"note","type":["null","string"],"default":null}"#);
    let second = client.register(&subject, &added).await.unwrap();
    assert_ne!(second, first);
    assert_eq!(client.latest(&subject).await.unwrap().id, second);
    // A required field without a default: refused under the registry's BACKWARD rule, not retried.
    let err = client
        .register(&subject, &order(r#",{"name":"qty","type":"long"}"#))
        .await
        .unwrap_err();
    assert!(
        !err.is_transient() && err.to_string().contains("409"),
        "{err}"
    );
}
