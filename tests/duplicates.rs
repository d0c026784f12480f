//! One server listed twice: refused when the builder can tell (two spellings of one endpoint),
//! and at the handshake when only the server can (its `run_id`: TCP and a Unix socket of one
//! server); a duplicate never counts towards a quorum.

mod common;

use common::RedisServer;
use redlock_mux::{Builder, Error};

#[test]
fn two_spellings_of_one_endpoint_are_refused_when_building() {
    let server = RedisServer::start();
    let port = server.port();
    let cases = [
        (
            format!("redis://localhost:{port}"),
            format!("redis://127.0.0.1:{port}"),
        ),
        (
            format!("redis://127.0.0.1:{port}"),
            format!("redis://:topsecret@LOCALHOST.:{port}/2"),
        ),
        (
            format!("redis://[::1]:{port}"),
            format!("redis://localhost:{port}"),
        ),
    ];
    for (first, second) in cases {
        // Another server between them: the message names the two that are the same.
        let servers = [
            first.clone(),
            "redis://10.0.0.1:6379".into(),
            second.clone(),
        ];
        let message = match Builder::new(&servers).build_client() {
            Err(Error::Config(message)) => message,
            other => panic!("{servers:?}: {other:?}"),
        };
        let second_shown = second.replace("topsecret", "***");
        assert!(
            message.contains(&format!(
                "{first} and {second_shown} are the same server (listed twice, it would \
                 count twice towards a quorum)"
            )),
            "{message}"
        );
        assert!(!message.contains("topsecret"), "{message}");
    }
}
