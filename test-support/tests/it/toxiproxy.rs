//! The Toxiproxy client against the real Toxiproxy, including the way it wedges (Shopify/toxiproxy#558).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use test_support::Services;
use test_support::toxiproxy::TOXIC_CHANGE_BOUND;

/// A server that writes to each connection as fast as it can, until the connection breaks.
fn flooding_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let address = listener.local_addr().expect("its address").to_string();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            let Ok(mut connection) = connection else {
                continue;
            };
            std::thread::spawn(move || {
                let chunk = vec![b'x'; 64 * 1024];
                while connection.write_all(&chunk).is_ok() {}
            });
        }
    });
    address
}

/// Reads at least one byte through `address` within `bound`.
fn reads_through(address: &str, bound: Duration) -> bool {
    let Ok(mut connection) = TcpStream::connect(address) else {
        return false;
    };
    connection
        .set_read_timeout(Some(bound))
        .expect("a read time-out");
    let mut byte = [0u8; 1];
    matches!(connection.read(&mut byte), Ok(1))
}

/// Wedges Toxiproxy the way a Kafka link under latency does: a client stops reading, so the latency toxic waits
/// to hand on its data; a toxic removal then waits for it holding the proxy's toxics' lock; the client goes away,
/// so its connection's writer waits for that lock too. The proxy's toxics never answer again. `heal` must still
/// return within its bound with a link that carries data, and the proxy's toxics must answer again.
#[tokio::test]
async fn heal_brings_back_a_link_whose_toxic_removal_wedged_toxiproxy() {
    let services = Services::get();
    let toxiproxy = services.toxiproxy();
    let proxy = toxiproxy.proxy("wedge", &flooding_server()).await;
    let stalled = TcpStream::connect(proxy.address()).expect("a connection through the proxy");
    let raw = reqwest::Client::new();
    let toxics = format!(
        "{}/proxies/{}/toxics",
        services.var("RATCHET_TOXIPROXY_URL"),
        proxy.name()
    );
    // Toxiproxy's buffers fill within a second or two; until they do, a removal succeeds and is tried again.
    let mut wedged = false;
    for _ in 0..10 {
        proxy.latency(20, 0).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let removal = raw
            .delete(format!("{toxics}/latency"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        match removal {
            Err(e) if e.is_timeout() => {
                wedged = true;
                break;
            }
            Err(e) => panic!("Toxiproxy refused the removal of the latency toxic: {e}"),
            Ok(answer) => assert!(answer.status().is_success(), "{answer:?}"),
        }
    }
    assert!(
        wedged,
        "a toxic removal on a link whose client stopped reading did not hang in 10 tries: Toxiproxy no longer \
         wedges this way (Shopify/toxiproxy#558 fixed?); test and module documentation need a new look"
    );
    // The client goes away while the removal waits: its connection's writer now waits for the removal's lock.
    drop(stalled);
    let listed = raw
        .get(&toxics)
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(
        listed.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the proxy's toxics still answer after the stalled client left ({listed:?}): not wedged"
    );

    let started = Instant::now();
    proxy.heal().await;
    let took = started.elapsed();
    assert!(
        took < TOXIC_CHANGE_BOUND + Duration::from_secs(5),
        "heal took {took:?} on a wedged proxy"
    );
    // Blocking reads in the test's own thread: nothing else runs on its runtime meanwhile.
    let reads = reads_through(proxy.address(), Duration::from_secs(5));
    assert!(reads, "no data through the healed proxy within 5 s");
    let answer = raw
        .get(&toxics)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .expect("the recreated proxy's toxics answer");
    assert!(answer.status().is_success(), "{answer:?}");
    let listed: serde_json::Value = answer.json().await.expect("a JSON list of toxics");
    assert_eq!(listed, serde_json::json!([]), "the healed proxy has toxics");
    proxy.delete().await;
}
